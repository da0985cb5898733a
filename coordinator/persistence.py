"""The coordinator's state directory: a restarted coordinator continues at the same version and model.

Two files, each written atomically (temp file, fsync, rename): ``model.safetensors`` (the global
model; its metadata carries version and arch id) and ``state.json`` (version, arch id, history
versions, strategy state, recent update ids, counters). The model is written first; if a crash falls
between the two renames, the checkpoint's version wins (the version must describe the model).
``state.json`` also holds the run identity (``run_id``, made when the folder is first used), the
devices that said Hello and the admission norms, and ``intake_seq``: the newest entry of the
update journal (``intake.py``) whose effect it holds; the ``Persister`` tells the journal
(``on_saved``) once a state is durable, and the journal deletes what it covers. Saves happen in the publisher thread before each
publish (``publisher.py``), at most every ``persist_interval_s``: at hundreds of updates per second
an fsync per aggregation would cost more than the aggregation itself.

A third file, ``plugins.safetensors``, holds the plug-ins' arrays (``state_tensors``: FedCurv's
per-device contributions, say), keyed ``plugin/key``. They can be O(devices x model), so the
``Persister`` rewrites it at most every ``plugin_interval_s`` (and at a clean shutdown); what it
holds is self-contained, so an older file beside a newer model is still consistent. A missing
file loses only those arrays (the plug-ins start without them).

A state file that cannot be read, or whose content is damaged, stops the start with a
``StateFileError`` naming it (the CLI exits 2, so systemd does not restart into it): starting over
would fork the run's versions or silently drop what the file holds. The one exception is a damaged
``plugins.safetensors``: it is moved aside (``plugins.safetensors.corrupt-<unix time>``, kept for
inspection) and the plug-ins start without its arrays, logged as an ERROR, since nothing in it can
be read back anyway and the model and the rest of the state are whole. A file that exists but
cannot be read (permissions, an I/O error) is never moved: its content may be fine.

Across software versions: ``state.json`` says its ``format`` (``STATE_FORMAT``) and the streamfl
version that wrote it (``written_by``). A newer streamfl reads every older format (keys it does
not know are ignored, keys an older one did not write take their defaults), so a new wheel over
the same state folder continues the run (``tests/test_state_upgrade.py`` loads the state folder
this version wrote, kept as ``tests/golden/state-format-1``). A state of a NEWER
format than this streamfl reads stops the start with a ``StateFileError`` naming the file, both
versions and the fix (run the newer streamfl again): reading it as far as it goes would drop
what it added without a word, and its next save would erase it for good.
"""
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from streamfl import __version__
from streamfl.coordinator.intake import INTAKE_SEQ
from streamfl.errors import ConfigError, StateFileError, StorageError
from streamfl.models import load_checkpoint, save_checkpoint, tensor_spec
from streamfl.models.serialize import atomic_write_bytes
from streamfl.protocol.messages import Tensors

log = logging.getLogger(__name__)

MODEL_FILE = "model.safetensors"
STATE_FILE = "state.json"
PLUGINS_FILE = "plugins.safetensors"
STATE_FORMAT = 1
#: The key of a state dict that holds the plug-ins' arrays ({plugin: {key: array}}), not JSON.
PLUGIN_TENSORS = "plugin_tensors"
#: Seconds between rewrites of plugins.safetensors (its arrays can be O(devices x model)).
PLUGIN_INTERVAL_S = 30.0
#: The types ``CoordinatorCore.restore`` reads each top-level key of ``state.json`` as (when set).
_STATE_KEYS = {"version": int, "arch_id": str, "run_id": str, "counters": dict, "admission": dict,
               "plugins": dict, "strategy": str, "strategy_state": dict,
               "recent_update_ids": list, "known_devices": list, INTAKE_SEQ: int}


class StateStore:
    """Reads and writes one state directory."""

    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)
        self.model_path = self.state_dir / MODEL_FILE
        self.state_path = self.state_dir / STATE_FILE
        self.plugins_path = self.state_dir / PLUGINS_FILE

    def save(self, tensors: Tensors, state: Dict[str, Any]) -> None:
        """Write model, the plug-ins' arrays (when ``state`` carries them) and state, each
        atomically; StorageError if the disk refuses."""
        meta = {"version": int(state["version"]), "arch_id": state["arch_id"]}
        save_checkpoint(self.model_path, tensors, meta)
        arrays = state.get(PLUGIN_TENSORS)
        if arrays is not None:
            flat = {"%s/%s" % (plugin, key): a for plugin, group in arrays.items()
                    for key, a in group.items()}
            if flat:
                save_checkpoint(self.plugins_path, flat, meta)
            elif self.plugins_path.exists():  # nothing left to keep: no stale arrays come back
                try:
                    self.plugins_path.unlink()
                except OSError as exc:
                    raise StorageError("cannot remove %s: %s" % (self.plugins_path,
                                                                 exc.strerror or exc)) from exc
        doc = {k: v for k, v in state.items() if k != PLUGIN_TENSORS}
        doc["format"] = STATE_FORMAT
        doc["written_by"] = __version__
        atomic_write_bytes(self.state_path, json.dumps(doc, sort_keys=True, indent=1).encode("utf-8"))

    def load(self, spec) -> Optional[Tuple[Tensors, Dict[str, Any]]]:
        """``(tensors, state)`` saved for model ``spec``, or None for a fresh directory.

        ConfigError if the directory belongs to another architecture; StateFileError naming the
        file if one cannot be read or is corrupt (never silently starts over: move the directory
        away to start fresh).
        """
        has_model = self.model_path.exists()
        has_state = self.state_path.exists()
        if not has_model and not has_state:
            return None
        if not has_model:
            raise StateFileError("state directory %s has %s but no %s: corrupt or incomplete state; "
                                 "move the directory away to start over"
                                 % (self.state_dir, STATE_FILE, MODEL_FILE))
        try:
            tensors, meta = load_checkpoint(self.model_path)
        except StorageError as exc:
            raise StateFileError("%s; move the state directory %s away to start over"
                                 % (exc, self.state_dir)) from exc
        state = self._read_state() if has_state else None
        if state is None:
            log.warning("%s is missing: recovering version and arch id from %s", self.state_path,
                        self.model_path)
            state = {"version": meta.get("version"), "arch_id": meta.get("arch_id")}
        arch_id = meta.get("arch_id", state.get("arch_id"))
        if arch_id != spec.arch_id or state.get("arch_id") != arch_id:
            raise ConfigError("state directory %s holds a model of architecture %s but the config "
                              "says %s: use another --state-dir or move this one away"
                              % (self.state_dir, arch_id, spec.arch_id))
        version = meta.get("version", state.get("version"))
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise StateFileError("%s has an invalid version %r; move the state directory away to "
                                 "start over" % (self.model_path, version))
        if state.get("version") != version:
            log.warning("%s says version %s but the model checkpoint is version %d (crash between the "
                        "two writes): continuing at %d", self.state_path, state.get("version"),
                        version, version)
            state = dict(state, version=version)
        self._check_tensors(tensors, spec)
        return tensors, dict(state, **{PLUGIN_TENSORS: self._read_plugins()})

    def _read_plugins(self) -> Dict[str, Dict[str, np.ndarray]]:
        """The plug-ins' arrays ({} without the file, or with a damaged one, moved aside and logged);
        StateFileError if it exists but cannot be read."""
        if not self.plugins_path.exists():
            return {}
        try:
            flat, _ = load_checkpoint(self.plugins_path)
        except StorageError as exc:
            if isinstance(exc.__cause__, OSError):
                raise StateFileError("%s; fix its permissions, or move it away to start the plug-ins "
                                     "without their saved arrays" % exc) from exc
            aside = self.plugins_path.with_name("%s.corrupt-%d" % (PLUGINS_FILE, int(time.time())))
            try:
                os.replace(str(self.plugins_path), str(aside))
            except OSError as move:
                raise StateFileError("%s, and it cannot be moved aside (%s): move it away to start the "
                                     "plug-ins without their saved arrays" % (exc, move.strerror or move)) from exc
            log.error("%s: moved aside to %s; the plug-ins start without their saved arrays", exc, aside)
            return {}
        out: Dict[str, Dict[str, np.ndarray]] = {}
        for key, a in flat.items():
            plugin, _, name = key.partition("/")
            out.setdefault(plugin, {})[name] = a
        return out

    def _read_state(self) -> Dict[str, Any]:
        try:
            raw = self.state_path.read_bytes()
        except OSError as exc:
            raise StateFileError("cannot read %s: %s" % (self.state_path, exc.strerror or exc)) from exc
        try:
            state = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise StateFileError("%s is corrupt (%s); move the state directory away to start over"
                                 % (self.state_path, exc)) from exc
        if not isinstance(state, dict) or "version" not in state or "arch_id" not in state:
            raise StateFileError("%s is corrupt: expected an object with version and arch_id; move the "
                                 "state directory away to start over" % self.state_path)
        written = state.get("format", 1)
        if not isinstance(written, int) or isinstance(written, bool) or written < 1:
            raise StateFileError("%s is corrupt: its format is %r; move the state directory away to "
                                 "start over" % (self.state_path, written))
        if written > STATE_FORMAT:
            raise StateFileError(
                "%s was written by a newer streamfl (%s, state format %d); this one (%s) reads "
                "formats up to %d: run that version or a newer one on this state folder (nothing "
                "in it was changed)" % (self.state_path, state.get("written_by") or "version unknown",
                                        written, __version__, STATE_FORMAT))
        for key, kinds in _STATE_KEYS.items():
            if state.get(key) is not None and not isinstance(state[key], kinds):
                raise StateFileError("%s is corrupt: %r is a %s; move the state directory away to "
                                     "start over" % (self.state_path, key, type(state[key]).__name__))
        return state

    def _check_tensors(self, tensors: Tensors, spec) -> None:
        problem = tensor_problem(tensors, spec)
        if problem is not None:
            raise StateFileError("%s: %s (corrupt)" % (self.model_path, problem))
        _as_float32(tensors)


def tensor_problem(tensors: Tensors, spec) -> Optional[str]:
    """What keeps ``tensors`` from being a model of ``spec`` (tensor names, shapes, finite values),
    or None: the one check of a model read from a file, a state folder's or a pre-trained one."""
    expected = tensor_spec(spec)
    if set(tensors) != set(expected):
        return "does not hold the tensors of %s (missing %s, unexpected %s)" % (
            spec.arch_id, sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected)))
    for name, (shape, _dtype) in expected.items():
        arr = tensors[name]
        if tuple(arr.shape) != tuple(shape):
            return "tensor %s has shape %s, %s needs %s" % (name, tuple(arr.shape), spec.arch_id,
                                                            tuple(shape))
        if not np.all(np.isfinite(arr)):
            return "tensor %s is not finite" % name
    return None


def _as_float32(tensors: Tensors) -> None:
    """Every tensor as float32, in place (the dtype the codec and the cores work in)."""
    for name, arr in tensors.items():
        if arr.dtype != np.float32:
            tensors[name] = arr.astype(np.float32)


def read_initial_model(path: Path, spec) -> Tensors:
    """A pre-trained model file's tensors, refused with a ConfigError naming the file unless they
    are floats, exactly those of ``spec`` (``tensor_problem``) and, where the file says, of its
    architecture."""
    try:
        tensors, meta = load_checkpoint(path)
    except StorageError as exc:
        raise ConfigError("initial_model_file: %s" % exc) from exc
    arch_id = meta.get("arch_id") if isinstance(meta, dict) else None
    if arch_id is not None and arch_id != spec.arch_id:
        raise ConfigError("initial_model_file %s holds a model of architecture %s, not the "
                          "configured %s" % (path, arch_id, spec.arch_id))
    ints = sorted(name for name, arr in tensors.items() if not np.issubdtype(arr.dtype, np.floating))
    problem = tensor_problem(tensors, spec) or (
        "tensors %s are not floats" % ints if ints else None)
    if problem is not None:
        raise ConfigError("initial_model_file %s: %s" % (path, problem))
    _as_float32(tensors)
    log.info("version 0 is the pre-trained model in %s", path)
    return tensors


class Persister:
    """Saves the core's model and state, counting failures instead of raising (a full disk must
    not kill the coordinator; what was not saved is simply not published)."""

    def __init__(self, store: StateStore, plugin_interval_s: float = PLUGIN_INTERVAL_S,
                 clock=time.monotonic, on_saved: Optional[Callable[[int], None]] = None):
        self.store = store
        self.saves = 0
        self.errors = 0
        #: The version last saved (None: nothing yet).
        self.saved_version: Optional[int] = None
        #: The ``intake_seq`` of the state last saved (or loaded): the update journal's entries up
        #: to it are covered.
        self.saved_intake_seq = 0
        #: Called with ``saved_intake_seq`` after each durable save whose state names one (the
        #: journal's drop: ``IntakeJournal.drop_through``); its errors are logged, never raised.
        self.on_saved = on_saved
        self.plugin_interval_s = float(plugin_interval_s)
        self._clock = clock
        self._plugins_saved_s: Optional[float] = None

    def save(self, tensors: Tensors, state: Dict[str, Any], force: bool = False) -> bool:
        """Write ``tensors`` and ``state`` durably; True if it worked. The plug-ins' arrays go
        along at most every ``plugin_interval_s`` (always with ``force``)."""
        now = self._clock()
        due = (force or self._plugins_saved_s is None
               or now - self._plugins_saved_s >= self.plugin_interval_s)
        if not due:
            state = {k: v for k, v in state.items() if k != PLUGIN_TENSORS}
        try:
            self.store.save(tensors, state)
        except StorageError as exc:
            self.errors += 1
            log.error("cannot persist coordinator state (version %d): %s", state["version"], exc)
            return False
        self.saves += 1
        self.saved_version = int(state["version"])
        if due and PLUGIN_TENSORS in state:
            self._plugins_saved_s = now
        mark = state.get(INTAKE_SEQ)
        if mark is not None:
            self.saved_intake_seq = int(mark)
            if self.on_saved is not None:
                try:
                    self.on_saved(self.saved_intake_seq)
                except Exception:  # the state is saved: a failed drop only leaves entries behind
                    log.exception("dropping the update journal's entries up to %d failed", mark)
        return True

    def is_saved(self, version: int, state: Dict[str, Any]) -> bool:
        """True when ``version`` and its state's journal mark are what was last saved: saving
        ``state`` again would change nothing that a restart reads back."""
        return (self.saved_version == version
                and state.get(INTAKE_SEQ, self.saved_intake_seq) == self.saved_intake_seq)

    def flush(self, core, now: float = 0.0) -> bool:
        """Save the core now, the plug-ins' arrays too (clean shutdown, start-up); only from the
        thread that owns the core."""
        return self.save(core.model, core.state(), force=True)
