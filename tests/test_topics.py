"""Topic names: fleet and device names are validated so no wildcard or separator reaches a topic."""
import pytest

from streamfl.errors import ConfigError
from streamfl.protocol.topics import DEVICE_KINDS, Topics, sanitize_name, validate_name
from streamfl.protocol.transport.memory import topic_matches


@pytest.mark.parametrize("name", ["a", "jetson-01", "rpi_5.lab", "A" * 64, "0"])
def test_valid_names(name):
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", "a/b", "+", "#", "dev+1", "x#", "a b", "é", "A" * 65, None, 5])
def test_invalid_names(name):
    with pytest.raises(ConfigError):
        validate_name(name)


def test_sanitize_name_always_gives_a_valid_name():
    for raw in ("my host.local", "a/b/c", "", "###", "x" * 100, "jetson-01"):
        assert validate_name(sanitize_name(raw)) == sanitize_name(raw)
    assert sanitize_name("jetson-01") == "jetson-01"
    assert sanitize_name("a/b") == "a-b"


def test_topic_layout_matches_design():
    t = Topics("lab")
    assert t.model == "streamfl/v1/lab/model"
    assert t.coordinator_status == "streamfl/v1/lab/coordinator/status"
    assert t.device("pi-1", "update") == "streamfl/v1/lab/device/pi-1/update"
    assert t.all_devices("status") == "streamfl/v1/lab/device/+/status"
    for kind in DEVICE_KINDS:
        assert topic_matches(t.all_devices(kind), t.device("pi-1", kind))
        assert not topic_matches(t.all_devices(kind), Topics("other").device("pi-1", kind))


def test_bad_fleet_device_or_kind_is_refused():
    with pytest.raises(ConfigError):
        Topics("a/b")
    with pytest.raises(ConfigError):
        Topics("lab").device("+", "update")
    with pytest.raises(ValueError):
        Topics("lab").device("pi-1", "firmware")
    with pytest.raises(ValueError):
        Topics("lab").all_devices("firmware")


def test_parse_device_topic():
    t = Topics("lab")
    for kind in DEVICE_KINDS:
        assert t.parse_device_topic(t.device("pi-1", kind)) == ("pi-1", kind)
    for topic in ("streamfl/v1/lab/model", "streamfl/v1/other/device/pi-1/update",
                  "streamfl/v1/lab/device/pi-1/firmware", "streamfl/v1/lab/device/pi-1/update/x",
                  "streamfl/v1/lab/device/p+1/update", "streamfl/v1/lab/device//update",
                  "streamfl/v1/lab/device/pi-1"):
        assert t.parse_device_topic(topic) is None, topic
