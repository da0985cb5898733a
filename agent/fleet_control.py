"""What a board does with the coordinator's fleet-control commands (``pause``, ``resume``, ``logs``,
``set``) and what it keeps of them across restarts.

The commands come on the board's command topic, checked like every coordinator command before
they get here (the pinned ``coordinator_public_key``'s signature, the run and the growing ``seq``
of ``agent/model_gate.py``); each one is answered with a ``DeviceReply`` on the board's ``reply``
topic, the coordinator's stamp in it:

- ``pause``: no round starts until ``resume`` (a round already training finishes and sends its
  update). The board keeps filling its buffer, serving predictions and sending telemetry (which
  says ``paused``); the runtime puts its clocks back to their originals, as between runs, so a
  paused board is not left throttled;
- ``logs``: the newest ``lines`` (default and at most ``control.log_lines``) of the agent's log,
  from a bounded ring in memory (``agent/log_ring.py``), cut so the answer fits
  ``protocol.control.MAX_REPLY_BYTES``;
- ``set``: ``name`` = one of ``LIVE_SETTINGS``, ``value`` = a number the agent's YAML would accept
  for that key (the same type and range checks), or null to go back to the YAML's value. The
  answer names the old and new value; an unknown name or a refused value is answered with the
  reason.

The paused flag and the settings pushed live are saved in the state folder (``control.json``,
atomically) before the answer leaves, so a restart keeps them: a pushed setting overrides the
YAML's until it is set again (or reset with null).
"""
import dataclasses
import json
import logging
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Tuple

from streamfl.config import bounded, field_range
from streamfl.errors import ConfigError
from streamfl.fileio import atomic_write
from streamfl.protocol.control import (MAX_ERROR_CHARS, MAX_LOG_LINE_CHARS, MAX_LOG_LINES,
                                       MAX_REPLY_BYTES, fit_lines)
from streamfl.protocol.messages import Command, DeviceReply

log = logging.getLogger(__name__)

#: The state folder's file with the paused flag and the settings pushed live.
CONTROL_FILE = "control.json"
FORMAT = 1
#: The agent YAML keys ``set`` may change on a running board: each one is read afresh every time
#: it is used, so a new value takes effect at once, and none changes what the board sends or how
#: much memory it takes.
LIVE_SETTINGS = ("round_interval_s", "telemetry_interval_s", "checkpoint_every_rounds")


@dataclass(frozen=True)
class ControlConfig:
    """How much of its log a board keeps for ``streamfl operator logs``.

    log_lines: the newest log lines kept in memory (and the most one answer carries). 200: a
      screenful and a half, the last rounds and any traceback; at most 200 (the coordinator's
      bound on an answer), 0 = keep none.
    log_line_chars: each line is cut to this many characters. 300: a log line with its
      traceback's last frame; at most 300.
    """

    log_lines: int = bounded(200, 0, MAX_LOG_LINES)
    log_line_chars: int = bounded(300, 40, MAX_LOG_LINE_CHARS)


def check_setting(config, name: str, value: Any):
    """``config`` (an ``AgentConfig``) with ``name`` set to ``value``, checked like the YAML
    (type, declared range, the cross-key checks); ``ConfigError`` with the reason otherwise."""
    if name not in LIVE_SETTINGS:
        raise ConfigError("unknown setting %r: the settings a board takes live are %s"
                          % (name, ", ".join(LIVE_SETTINGS)))
    f = {x.name: x for x in dataclasses.fields(config)}[name]
    tp = typing.get_type_hints(type(config))[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError("%s: expected a number, got %r" % (name, value))
    if tp is int:
        if not isinstance(value, int):
            raise ConfigError("%s: expected an integer, got %r" % (name, value))
    else:
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError("%s: expected a finite number, got %r" % (name, value))
    rng = field_range(f)
    if rng is not None and value not in rng:
        raise ConfigError("%s: %r is out of range, expected a value in %s" % (name, value, rng))
    try:
        return dataclasses.replace(config, **{name: value})
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


class FleetControl:
    """The board's paused flag and live settings, saved in ``state_dir``; answers the commands."""

    def __init__(self, state_dir: Path, config, log_ring=None):
        self.path = Path(state_dir) / CONTROL_FILE
        #: The YAML's configuration, and the one in force (with the settings pushed live).
        self.configured = config
        self.config = config
        self.log_ring = log_ring
        self.paused = False
        self.settings: Dict[str, Any] = {}
        self._load()

    # ---- the state file -----------------------------------------------------------------------
    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("cannot read %s (%s): not paused, no setting pushed live", self.path,
                        exc.strerror or exc)
            return
        try:
            doc = json.loads(raw.decode("utf-8"))
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError("not a format %d control file" % FORMAT)
            paused, settings = doc.get("paused", False), doc.get("settings", {})
            if type(paused) is not bool or not isinstance(settings, dict):
                raise ValueError("paused must be true or false and settings a mapping")
        except (ValueError, UnicodeDecodeError) as exc:
            log.warning("ignoring %s: %s", self.path, exc)
            return
        self.paused = paused
        for name, value in settings.items():
            try:
                self.config = check_setting(self.config, name, value)
            except ConfigError as exc:
                log.warning("ignoring the setting pushed live in %s: %s", self.path, exc)
                continue
            self.settings[name] = value
        if self.settings:
            log.info("settings pushed by the operator (%s) override the configuration: %s",
                     self.path, ", ".join("%s=%s" % kv for kv in sorted(self.settings.items())))
        if self.paused:
            log.warning("this board is paused by the operator (%s): no round starts until "
                        "'streamfl operator resume'", self.path)

    def _save(self) -> None:
        doc = {"format": FORMAT, "paused": self.paused, "settings": dict(sorted(self.settings.items()))}
        atomic_write(self.path, json.dumps(doc, indent=1).encode("utf-8"))

    # ---- commands -----------------------------------------------------------------------------
    def handle(self, cmd: Command, device_id: str, encoded_size=None) -> Tuple[DeviceReply, bool]:
        """The answer to ``cmd`` and whether the configuration in force changed; ``encoded_size``
        (kept lines -> bytes of the whole answer) cuts a ``logs`` answer to fit."""
        reply = DeviceReply(device_id=device_id, kind=cmd.kind, seq=cmd.seq, ok=True,
                            run_id=cmd.run_id)
        before = self.config
        try:
            if cmd.kind in ("pause", "resume"):
                reply.result = self._pause(cmd.kind == "pause")
            elif cmd.kind == "logs":
                reply.result = self._logs(cmd.params, reply, encoded_size)
            elif cmd.kind == "set":
                reply.result = self._set(cmd.params)
            else:
                raise ConfigError("%r is not a fleet-control command" % cmd.kind)
        except ConfigError as exc:
            reply.ok, reply.error, reply.result = False, str(exc)[:MAX_ERROR_CHARS], {}
            log.warning("refused the operator's %s command: %s", cmd.kind, exc)
        return reply, self.config is not before

    def _pause(self, pause: bool) -> Dict[str, Any]:
        was = self.paused
        self.paused = pause
        try:
            self._save()
        except OSError as exc:
            self.paused = was
            raise ConfigError("cannot save the paused state in %s: %s" % (self.path, exc.strerror or exc))
        if pause != was:
            log.warning("paused by the operator: no round starts until 'streamfl operator resume'"
                        if pause else "resumed by the operator: rounds start again")
        return {"paused": pause, "was_paused": was}

    def _logs(self, params: Mapping[str, Any], reply: DeviceReply, encoded_size) -> Dict[str, Any]:
        most = 0 if self.log_ring is None else self.log_ring.max_lines
        n = params.get("lines", most)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError("lines must be a count, got %r" % (n,))
        lines = self.log_ring.lines(min(n, most)) if self.log_ring is not None else []
        dropped = 0
        if encoded_size is not None:
            dropped = fit_lines(lines, lambda kept: encoded_size(dataclasses.replace(
                reply, result={"lines": kept, "dropped_lines": len(lines)})), MAX_REPLY_BYTES)
        return {"lines": lines[dropped:], "dropped_lines": dropped}

    def _set(self, params: Mapping[str, Any]) -> Dict[str, Any]:
        name, value = params.get("name"), params.get("value")
        if not isinstance(name, str):
            raise ConfigError("set needs name (one of %s) and value" % ", ".join(LIVE_SETTINGS))
        if name not in LIVE_SETTINGS:
            check_setting(self.config, name, value)  # raises, with the reason
        old = getattr(self.config, name)
        if value is None:  # back to the YAML's value
            new_config = check_setting(self.config, name, getattr(self.configured, name))
        else:
            new_config = check_setting(self.config, name, value)
        settings = dict(self.settings)
        if value is None:
            settings.pop(name, None)
        else:
            settings[name] = getattr(new_config, name)
        saved = self.settings
        self.settings = settings
        try:
            self._save()
        except OSError as exc:
            self.settings = saved
            raise ConfigError("cannot save the setting in %s: %s" % (self.path, exc.strerror or exc))
        self.config = new_config
        new = getattr(new_config, name)
        log.warning("the operator set %s from %s to %s%s", name, old, new,
                    " (the configured value)" if value is None else "")
        return {"name": name, "old": old, "new": new}
