"""The optional jtop reader: a summary from a jtop-shaped client, and None when jtop is absent."""
import sys

from streamfl.dvfs.jtop_status import read_jtop, summarize_jtop


class Model:
    name, id = "15W", 0


class Client:
    """Shaped like jetson-stats' jtop object."""

    nvpmodel = Model()
    jetson_clocks = False
    cpu = {"cpu": [{"online": True, "freq": {"cur": 1510400}}, {"online": False, "freq": {"cur": 0}}]}
    gpu = {"gpu": {"freq": {"cur": 624750, "max": 624750}}}


def test_summary_reads_power_mode_clocks_and_jetson_clocks():
    out = summarize_jtop(Client())
    assert out == {"nvpmodel": "15W (id 0)", "jetson_clocks": "False", "cpu_khz": [1510400],
                   "gpu_khz": {"gpu": 624750}}


def test_absent_or_broken_jtop_gives_none(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "jtop", None)          # import jtop raises ImportError
    assert read_jtop() is None

    def broken():
        raise OSError("/run/jtop.sock: permission denied")
    assert read_jtop(broken) is None
    assert "permission denied" in caplog.text
    assert read_jtop(lambda: Client())["nvpmodel"] == "15W (id 0)"
