"""Every numeric configuration key declares its range, and the loader and ``--check-config`` of
both programs refuse NaN, infinities and values outside it, naming the key and the file.

The walk covers every config dataclass reachable from ``CoordinatorConfig`` and ``AgentConfig``
and every registered plug-in's settings (``plugins:``), so a key added later without a range
fails here.
"""
import dataclasses
import math
import typing
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

import pytest
import yaml

from streamfl.agent import cli as agent_cli
from streamfl.agent.config import AgentConfig, load_agent_config
from streamfl.methods import agent_plugins
from streamfl.config import INFINITE, Range, bounded, build, field_range, nest
from streamfl.coordinator import cli as coordinator_cli
from streamfl.coordinator.config import CoordinatorConfig, load_config
from streamfl.methods import coordinator_plugins
from streamfl.errors import ConfigError

_NONE = type(None)


def _args(tp: Any) -> Tuple[Any, ...]:
    return tuple(a for a in typing.get_args(tp) if a is not _NONE and a is not Ellipsis)


def _numeric(tp: Any) -> bool:
    """int or float, alone, Optional or in a tuple (bool is neither)."""
    if tp in (int, float):
        return True
    if typing.get_origin(tp) in (typing.Union, tuple):
        return any(_numeric(a) for a in _args(tp))
    return False


def _is_float(tp: Any) -> bool:
    return tp is float or (typing.get_origin(tp) in (typing.Union, tuple) and any(_is_float(a) for a in _args(tp)))


def _dataclasses_in(tp: Any) -> Iterator[type]:
    if dataclasses.is_dataclass(tp):
        yield tp
    for a in _args(tp):
        yield from _dataclasses_in(a)


#: A numeric key: (program, dotted path in its YAML, owning dataclass, field, annotation).
Key = Tuple[str, str, type, dataclasses.Field, Any]


def _walk(program: str, cls: type, prefix: str, out: List[Key], seen: set) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        path = prefix + f.name
        if _numeric(tp):
            out.append((program, path, cls, f, tp))
        for sub in _dataclasses_in(tp):
            if (program, path, sub) not in seen:
                seen.add((program, path, sub))
                _walk(program, sub, path + ".", out, seen)


def numeric_keys() -> List[Key]:
    out: List[Key] = []
    seen: set = set()
    _walk("coordinator", CoordinatorConfig, "", out, seen)
    _walk("agent", AgentConfig, "", out, seen)
    for program, registry in (("coordinator", coordinator_plugins()), ("agent", agent_plugins())):
        for name, plugin in registry.items():
            _walk(program, plugin.Config, "plugins.%s." % name, out, seen)
    return out


KEYS = numeric_keys()
RANGED = [k for k in KEYS if field_range(k[3]) is not None]


def _id(key: Key) -> str:
    return "%s:%s" % (key[0], key[1])


def test_the_walk_sees_nested_sections_and_every_registered_plugin():
    paths = {_id(k) for k in KEYS}
    assert {"coordinator:admission.max_abs_value", "coordinator:fedavg.deadline_s",
            "coordinator:hparams.lr", "coordinator:mqtt.reconnect_max_s", "coordinator:model.hidden",
            "agent:sensor.windows_per_s", "agent:dvfs.energy_rate_hz", "agent:round_interval_s",
            "coordinator:plugins.fedcurv.penalty_strength", "coordinator:plugins.sfedpo.max_factor",
            "agent:plugins.clp.initial_lr", "agent:plugins.stewc.stability"} <= paths
    for program, registry in (("coordinator", coordinator_plugins()), ("agent", agent_plugins())):
        for name, plugin in registry.items():
            numeric = [f for f in dataclasses.fields(plugin.Config) if _numeric(typing.get_type_hints(plugin.Config)[f.name])]
            assert len([k for k in KEYS if k[0] == program and k[1].startswith("plugins.%s." % name)]) == len(numeric)


def test_every_numeric_key_declares_a_range_holding_its_default():
    missing = ["%s (%s.%s)" % (_id(k), k[2].__module__, k[2].__name__) for k in KEYS if field_range(k[3]) is None]
    assert missing == [], "numeric keys without a declared range (streamfl.config.bounded): %s" % missing
    for key in RANGED:
        rng, default = field_range(key[3]), key[3].default
        assert default is dataclasses.MISSING or default is None or default in rng, (_id(key), default, rng)
        assert not key[3].metadata.get(INFINITE), _id(key)


def _outside(rng: Range, tp: Any) -> List[Any]:
    """Values just below and well above ``rng`` of the field's number type."""
    integer = not _is_float(tp)
    low = rng.lo if rng.lo_open else (rng.lo - 1 if integer else rng.lo - max(1.0, abs(rng.lo)))
    high = rng.hi + 1 if integer else (rng.hi * 10 if rng.hi > 0 else rng.hi + 1.0)
    return [low, high, 10 ** 400 if integer else 1e300]


def _load(program: str, file: Path):
    return (load_config if program == "coordinator" else load_agent_config)(file)


def _refused(program: str, path: str, value: Any, tmp_path: Path) -> str:
    file = tmp_path / ("%s.yaml" % program)
    file.write_text(yaml.safe_dump(nest({path: value})))
    with pytest.raises(ConfigError) as err:
        _load(program, file)
    return str(err.value)


@pytest.mark.parametrize("key", RANGED, ids=_id)
def test_the_loader_refuses_values_outside_the_range_naming_key_and_file(key, tmp_path):
    program, path, _cls, f, tp = key
    for value in _outside(field_range(f), tp):
        message = _refused(program, path, value, tmp_path)
        assert str(tmp_path / ("%s.yaml" % program)) in message, message
        assert "'%s'" % f.name in message and "out of range" in message, message


@pytest.mark.parametrize("key", [k for k in KEYS if _is_float(k[4])], ids=_id)
def test_the_loader_refuses_nan_and_infinities_for_every_float_key(key, tmp_path):
    program, path, _cls, f, tp = key
    for value in (float("nan"), float("inf"), float("-inf")):
        if typing.get_origin(tp) is tuple:
            value = [value]
        message = _refused(program, path, value, tmp_path)
        assert str(tmp_path / ("%s.yaml" % program)) in message, message
        assert "'%s'" % f.name in message and "finite" in message, message


def test_the_shipped_example_configs_load():
    root = Path(__file__).resolve().parents[1] / "configs"
    load_config(root / "coordinator.example.yaml")
    load_agent_config(root / "agent.example.yaml")


#: The keys that once took ``.inf`` or 1e300 through ``--check-config``.
COORDINATOR_KEYS = ["persist_interval_s", "publish_min_interval_s", "admission.max_abs_value",
                    "admission.norm_multiplier", "admission.reject_multiplier",
                    "admission.min_norm_ratio", "fedavg.deadline_s", "staleness_a",
                    "plugins.fedcurv.penalty_strength", "plugins.stewc.temporal_strength", "plugins.sfedpo.max_factor"]
AGENT_KEYS = ["round_interval_s", "lr", "max_skip_rounds", "sensor.windows_per_s", "mqtt.reconnect_max_s"]


def _check_config(program: str, file: Path, capsys) -> Tuple[int, str]:
    if program == "coordinator":
        code = coordinator_cli.main(["--check-config", "--config", str(file)])
    else:
        code = agent_cli.main(["--check-config", "--config", str(file)], environ={})
    return code, capsys.readouterr().err


@pytest.mark.parametrize("program,path", [("coordinator", k) for k in COORDINATOR_KEYS]
                         + [("agent", k) for k in AGENT_KEYS])
def test_check_config_refuses_infinite_and_huge_values_with_exit_2(program, path, tmp_path, capsys):
    file = tmp_path / "bad.yaml"
    for text in (".inf", "-.inf", ".nan", "1e300"):
        file.write_text(yaml.safe_dump(nest({path: "@"})).replace("'@'", text))
        code, err = _check_config(program, file, capsys)
        assert code == 2, (path, text, err)
        assert str(file) in err and "'%s'" % path.split(".")[-1] in err, err


def test_check_config_refuses_a_zero_round_interval(tmp_path, capsys):
    file = tmp_path / "agent.yaml"
    file.write_text("round_interval_s: 0\n")
    code, err = _check_config("agent", file, capsys)
    assert code == 2 and "'round_interval_s'" in err and "(0, 86400]" in err, err


def test_check_config_accepts_values_at_the_range_ends(tmp_path, capsys):
    file = tmp_path / "coordinator.yaml"
    file.write_text("persist_interval_s: 3600\npublish_min_interval_s: 0\nadmission: {norm_multiplier: 1}\n")
    assert _check_config("coordinator", file, capsys)[0] == 0


def test_bounded_needs_a_finite_range_and_checks_optional_and_tuple_values():
    with pytest.raises(ValueError):
        bounded(1.0, 0.0, math.inf)
    with pytest.raises(ValueError):
        bounded(1.0, 2.0, 1.0)

    @dataclasses.dataclass(frozen=True)
    class Settings:
        a: Optional[int] = bounded(None, 1, 3)
        b: Tuple[float, ...] = bounded((), 0.0, 1.0, lo_open=True)

    assert build(Settings, {"a": None, "b": [0.5, 1]}) == Settings(None, (0.5, 1.0))
    with pytest.raises(ConfigError, match=r"key 'a': 4 is out of range, expected a value in \[1, 3\]"):
        build(Settings, {"a": 4})
    with pytest.raises(ConfigError, match=r"key 'b'\[1\]: 0 is out of range, expected a value in \(0, 1\]"):
        build(Settings, {"b": [0.5, 0]})
