"""What the coordinator's named method sets on this board, judged against the board's own config.

A coordinator that runs a named method (``streamfl-coordinator --method NAME``) puts the method's
agent side in every global model (the ``method_settings`` extra, ``streamfl.methods.agent_side``),
so boards need no per-method YAML. Every value in it came from the network and is hostile until
bounded: ``MethodSettingsGate`` builds the board's settings from its own config with each received
key laid over it, one key at a time, through the same dataclasses and declared ranges as the
board's YAML (``streamfl.config``, ``streamfl.plugins.build_settings``), and applies only what a
coordinator may set:

- ``plugins.<name>.<key>`` of a plug-in this board has, except the keys its settings dataclass
  names in ``BOARD_KEYS`` (facts of the board, e.g. its radio);
- ``dvfs.policy`` and ``dvfs.policy_options`` (the clock policy), one that plans over whatever
  domains the board has (``SENT_POLICIES``: not ``fixed``, whose domain names are the board's),
  except ``power_w`` (the board's power model is its profile's), and only on a board whose own
  ``dvfs.policy`` is not ``none``: a board's operator hands the clocks over by choosing a policy. A method's ``none`` ("clocks left
  alone") is applied as ``performance`` on a board in ``cap`` mode (every cap at the top: the
  governor runs the clocks, as on a board streamfl does not touch) and refused in ``pin`` mode.

Anything else (an unknown section or plug-in, a board key, a value of the wrong type, out of its
range or failing its dataclass's checks) is not applied; the rest of the payload still is. What
was refused is said in one WARNING per payload, at most one a minute (with the count held back).
A newest global model without the extra means the coordinator no longer sends settings: the board
goes back to its own config (logged once). Hyper-parameters are not here: they come with every
model's ``hparams``, clamped to the board's ``hparam_limits`` (``streamfl.agent.hparams``).
"""
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from streamfl.agent.plugins import registered
from streamfl.config import build, to_dict
from streamfl.dvfs.config import DvfsConfig
from streamfl.errors import ConfigError
from streamfl.logs import RateLimitedLog
from streamfl.methods.agent_side import (BOARD_POLICY_OPTIONS, CLOCK_KEYS, KIND, SENT_POLICIES, SENT_SECTIONS,
                                         MethodSettings, board_keys)
from streamfl.plugins import build_settings, rename_keys
from streamfl.protocol.messages import GlobalModel

log = logging.getLogger(__name__)

#: Seconds between two warnings about refused settings (the rest are counted and said with the
#: next): a coordinator that keeps sending a bad key is said once a minute, not once a model.
REFUSED_WARN_INTERVAL_S = 60.0
#: Characters of one refusal warning (a hostile payload can hold many bad keys).
REFUSED_WARN_MAX_CHARS = 1500


@dataclass(frozen=True)
class BoardSettings:
    """The settings this board runs with under one global model: every plug-in's settings
    dataclass, and the clock config (None where this runtime sets no clocks)."""

    #: The coordinator's named method ("" while it sends none: the board's own config).
    method: str
    plugins: Dict[str, Any]
    dvfs: Optional[DvfsConfig]


class MethodSettingsGate:
    """Turns each global model's ``method_settings`` into the settings this board runs with."""

    def __init__(self, plugins: Mapping[str, Any], dvfs: Optional[DvfsConfig] = None,
                 clock: Callable[[], float] = time.monotonic):
        #: The board's own settings (its YAML), also what it goes back to.
        self.own = BoardSettings("", dict(plugins), dvfs)
        self._last_payload: Optional[MethodSettings] = None
        self._last = self.own
        self._refused = RateLimitedLog(log, REFUSED_WARN_INTERVAL_S, clock=clock,
                                       held_note="(%d more refusals held back: %s)")

    def resolve(self, gm: GlobalModel) -> BoardSettings:
        """The settings under ``gm``: its method's, judged (cached while the payload is the same),
        or the board's own when it carries none."""
        extra = gm.extras.get(KIND)
        if not isinstance(extra, MethodSettings):
            if self._last_payload is not None:
                log.info("global model v%d carries no method settings (the coordinator no longer "
                         "runs method %s): back to this board's own settings", gm.version,
                         self._last_payload.method)
            self._last_payload, self._last = None, self.own
            return self.own
        if extra == self._last_payload:
            return self._last
        refused: List[str] = []
        judged = self.judge(extra, refused)
        if refused:
            text = "; ".join(refused)
            if len(text) > REFUSED_WARN_MAX_CHARS:
                text = text[:REFUSED_WARN_MAX_CHARS] + "..."
            self._refused.event("refused", logging.WARNING,
                                "global model v%d: settings of method %s not applied: %s",
                                gm.version, extra.method, text)
        if self._last_payload is None or extra.method != self._last_payload.method:
            log.info("global model v%d: the coordinator runs method %s", gm.version, extra.method)
        self._last_payload, self._last = extra, judged
        return judged

    def judge(self, extra: MethodSettings, refused: List[str]) -> BoardSettings:
        """The board's settings with what ``extra`` may set laid over them; each refusal (key,
        value, why) appended to ``refused``."""
        settings = extra.settings
        for key in settings:
            if key not in SENT_SECTIONS:
                refused.append("%s (not a setting a coordinator may set on a board)" % key)
        plugins = dict(self.own.plugins)
        received = settings.get("plugins")
        if received is not None:
            if not isinstance(received, Mapping):
                refused.append("plugins=%.80r (expected a mapping)" % (received,))
            else:
                classes = registered()
                for name, values in received.items():
                    cls = classes.get(name)
                    if cls is None:
                        refused.append("plugins.%s (no such plug-in on this board)" % name)
                    elif not isinstance(values, Mapping):
                        refused.append("plugins.%s=%.80r (expected a mapping)" % (name, values))
                    else:
                        plugins[name] = self._plugin(cls, name, values, refused)
        dvfs = self.own.dvfs
        if "dvfs" in settings:
            dvfs = self._clocks(settings["dvfs"], refused)
        return BoardSettings(extra.method, plugins, dvfs)

    def _plugin(self, cls: type, name: str, values: Mapping[str, Any], refused: List[str]) -> Any:
        """Plug-in ``name``'s settings: the board's own with each acceptable key of ``values``."""
        own = self.own.plugins.get(name)
        base = to_dict(own) if own is not None else {}
        try:
            values = rename_keys(cls.Config, values, "plugins.%s" % name)
        except ConfigError as exc:
            refused.append("plugins.%s (%s)" % (name, exc))
            return own if own is not None else build_settings(cls, name, None)
        local = board_keys(cls.Config)
        accepted: Dict[str, Any] = {}
        for key, value in values.items():
            where = "plugins.%s.%s" % (name, key)
            if key in local:
                refused.append("%s (this board's own, never set from the network)" % where)
                continue
            trial = dict(base)
            trial.update(accepted)
            trial[key] = value
            try:
                build_settings(cls, name, trial)
            except ValueError as exc:
                refused.append("%s=%.80r (%s)" % (where, value, _reason(exc, "plugins.%s" % name)))
                continue
            accepted[key] = value
        final = dict(base)
        final.update(accepted)
        return build_settings(cls, name, final)  # every key passed with the ones before it

    def _clocks(self, received: Any, refused: List[str]) -> Optional[DvfsConfig]:
        """The clock config: the board's own, or its policy replaced as ``received`` says."""
        own = self.own.dvfs
        if own is None:
            refused.append("dvfs (this runtime sets no clocks)")
            return None
        if not isinstance(received, Mapping):
            refused.append("dvfs=%.80r (expected a mapping)" % (received,))
            return own
        for key in received:
            if key not in CLOCK_KEYS:
                refused.append("dvfs.%s (not a setting a coordinator may set on a board)" % key)
        policy = received.get("policy", own.policy)
        options = received.get("policy_options", {})
        if not isinstance(policy, str) or not isinstance(options, Mapping):
            refused.append("dvfs=%.120r (expected a policy name and a mapping of options)" % (dict(received),))
            return own
        if policy not in SENT_POLICIES:
            refused.append("dvfs.policy=%.40r (a coordinator may send %s)" % (policy, ", ".join(SENT_POLICIES)))
            return own
        if own.policy == "none":
            refused.append("dvfs.policy=%.40r (this board's own dvfs.policy is none: its operator "
                           "has not handed its clocks over)" % (policy,))
            return own
        options = dict(options)
        for key in BOARD_POLICY_OPTIONS:
            if key in options:
                options.pop(key)
                refused.append("dvfs.policy_options.%s (this board's own, from its profile)" % key)
        if policy == "none":
            if own.mode != "cap":
                refused.append("dvfs.policy='none' (in pin mode this board cannot hand its clocks "
                               "back to the governor)")
                return own
            policy, options = "performance", {}  # caps at the top: the governor runs the clocks
        merged = dict(own.policy_options) if policy == own.policy else {}
        merged.update(options)
        values = to_dict(own)
        values.update(policy=policy, policy_options=merged)
        try:
            config = build(DvfsConfig, values, "dvfs")
            config.policy_kwargs()  # the board's power model, where the options need it
        except (ConfigError, ValueError) as exc:
            refused.append("dvfs.policy=%.40r with %.120r (%s)" % (policy, options, _reason(exc, "dvfs")))
            return own
        return config


def _reason(exc: Exception, source: str) -> str:
    """``exc``'s message without its ``source: `` prefix."""
    text = str(exc)
    return text[len(source) + 2:] if text.startswith(source + ": ") else text


def describe_change(old: Any, new: Any) -> Tuple[str, ...]:
    """``key: old -> new`` for each field of two settings dataclasses that differs."""
    before, after = to_dict(old), to_dict(new)
    return tuple("%s: %r -> %r" % (key, before.get(key), after[key])
                 for key in after if before.get(key) != after[key])
