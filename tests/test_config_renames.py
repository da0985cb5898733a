"""Renamed plug-in keys: every old name points at a key that exists, still loads with a warning
naming both, and giving both names is an error."""
import dataclasses
import logging

import pytest

from streamfl import plugins as plugin_settings
from streamfl.agent.config import AgentConfig
from streamfl.agent.plugins import registered as agent_plugins
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.plugins import registered as coordinator_plugins
from streamfl.errors import ConfigError
from streamfl.plugins import build_settings, renamed_keys
from factories import SPEC

SIDES = {"agent": agent_plugins, "coordinator": coordinator_plugins}
RENAMED = [(side, name, cls, old, new) for side, registry in SIDES.items()
           for name, cls in registry().items() for old, new in renamed_keys(cls.Config).items()]


@pytest.fixture(autouse=True)
def fresh_warnings():
    """Each test sees the first warning of every old key (they are said once per process)."""
    plugin_settings._warned.clear()
    yield
    plugin_settings._warned.clear()


def _init_fields(config_cls):
    return {f.name for f in dataclasses.fields(config_cls) if f.init}


def test_there_are_renamed_keys_on_both_sides():
    assert {side for side, *_ in RENAMED} == {"agent", "coordinator"}
    assert len(RENAMED) >= 16


@pytest.mark.parametrize("side, name, cls, old, new", RENAMED,
                         ids=["%s:%s.%s" % (r[0], r[1], r[3]) for r in RENAMED])
def test_every_rename_points_at_a_key_that_exists(side, name, cls, old, new):
    fields = _init_fields(cls.Config)
    assert new in fields, "%s: RENAMED maps %r to %r, which is not a key" % (name, old, new)
    assert old not in fields, "%s: old key %r is still a key of its own" % (name, old)


@pytest.mark.parametrize("side, name, cls, old, new", RENAMED,
                         ids=["%s:%s.%s" % (r[0], r[1], r[3]) for r in RENAMED])
def test_an_old_key_still_works_and_warns(side, name, cls, old, new, caplog):
    value = getattr(cls.Config(), new)
    with caplog.at_level(logging.WARNING, logger="streamfl.plugins"):
        config = build_settings(cls, name, {old: value})
    assert config == build_settings(cls, name, {new: value})
    warnings = [r.getMessage() for r in caplog.records if r.name == "streamfl.plugins"]
    assert len(warnings) == 1 and repr(old) in warnings[0] and repr(new) in warnings[0], warnings


@pytest.mark.parametrize("side, name, cls, old, new", RENAMED,
                         ids=["%s:%s.%s" % (r[0], r[1], r[3]) for r in RENAMED])
def test_both_names_given_is_an_error(side, name, cls, old, new):
    value = getattr(cls.Config(), new)
    with pytest.raises(ValueError, match="%r and %r" % (old, new)):
        build_settings(cls, name, {old: value, new: value})


def test_a_renamed_value_is_used_and_warns_once(caplog):
    with caplog.at_level(logging.WARNING, logger="streamfl.plugins"):
        for _ in range(3):
            config = build(CoordinatorConfig, {"model": SPEC, "plugins": {"sessions": {"kappa": 3.0}}},
                           "test").plugins["sessions"]
            assert config.similarity_sharpness == 3.0
    warnings = [r.getMessage() for r in caplog.records if r.name == "streamfl.plugins"]
    assert len(warnings) == 1 and "plugins.sessions" in warnings[0]


def test_both_names_in_a_general_config_are_a_config_error():
    with pytest.raises(ConfigError, match="'eta0' and 'initial_lr'"):
        build(AgentConfig, {"device_id": "a1", "model": SPEC,
                            "plugins": {"clp": {"eta0": 0.01, "initial_lr": 0.01}}}, "test")
    with pytest.raises(ConfigError, match="'sigma' and 'growth_threshold'"):
        build(CoordinatorConfig, {"model": SPEC, "plugins": {"clp": {"sigma": 0.1,
                                                                      "growth_threshold": 0.1}}}, "test")
