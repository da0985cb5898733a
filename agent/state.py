"""The agent's state directory: local-model checkpoint (resume after a restart) and the outbox folder.

Layout: ``checkpoint.safetensors`` (weights + meta {global_version, round_index, device_id, arch_id},
written atomically), ``outbox/`` and the DVFS originals (``streamfl.dvfs.guard``).

A folder the agent cannot write, or a checkpoint it cannot read (permissions, an I/O error), stops
the start with a ``StateFileError`` naming the path (exit code 2: a restart finds it the same). A
checkpoint whose content is damaged is moved aside (``checkpoint.safetensors.corrupt-<unix
time>``, kept for inspection) and the agent starts from the coordinator's next global model, as on
a fresh folder: the checkpoint is only a head start, the coordinator holds the fleet's model, so
nothing is lost that the next model does not bring back. Damaged outbox frames are moved aside by
``Outbox`` the same way.
"""
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from streamfl.errors import StateFileError, StorageError
from streamfl.models import load_checkpoint, save_checkpoint

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.safetensors"
OUTBOX_NAME = "outbox"


class StateDir:
    """One agent's persistent folder; ``prepare`` checks it is writable before anything runs."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @property
    def checkpoint_path(self) -> Path:
        return self.path / CHECKPOINT_NAME

    @property
    def outbox_path(self) -> Path:
        return self.path / OUTBOX_NAME

    def prepare(self) -> "StateDir":
        """Create the folder and prove it is writable and its checkpoint readable, else
        ``StateFileError`` saying what to fix."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".probe-", dir=str(self.path))
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise StateFileError(
                "state directory %s is not writable (%s): create it for the agent's user "
                "(e.g. systemd StateDirectory=streamfl-agent) or pass --state-dir"
                % (self.path, exc.strerror or exc)) from exc
        path = self.checkpoint_path
        if path.exists():  # before anything starts: a checkpoint it cannot read stops the start
            try:
                with open(str(path), "rb"):
                    pass
            except OSError as exc:
                raise StateFileError("cannot read checkpoint %s: %s: fix its permissions or move it "
                                     "away" % (path, exc.strerror or exc)) from exc
        return self

    def save_checkpoint(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        """Write the local model atomically (a crash leaves the previous checkpoint intact)."""
        save_checkpoint(self.checkpoint_path, arrays, dict(meta))

    def load_checkpoint(self, arch_id: str) -> Optional[Tuple[Dict[str, np.ndarray], Dict[str, Any]]]:
        """The checkpoint if there is one for ``arch_id``; another arch is skipped, a damaged file
        moved aside (logged); ``StateFileError`` if it exists but cannot be read."""
        path = self.checkpoint_path
        if not path.exists():
            return None
        try:
            arrays, meta = load_checkpoint(path)
        except StorageError as exc:
            if isinstance(exc.__cause__, OSError):
                raise StateFileError("%s: fix its permissions or move it away" % exc) from exc
            self._move_aside(path, exc)
            return None
        if meta.get("arch_id") != arch_id:
            log.warning("ignoring checkpoint %s of architecture %s: this agent runs %s",
                        path, meta.get("arch_id"), arch_id)
            return None
        return arrays, meta

    @staticmethod
    def _move_aside(path: Path, why: Exception) -> None:
        """Rename damaged ``path`` to ``<name>.corrupt-<unix time>`` and say so; StateFileError if
        it cannot be moved (it would be read again at every start)."""
        aside = path.with_name("%s.corrupt-%d" % (path.name, int(time.time())))
        try:
            os.replace(str(path), str(aside))
        except OSError as exc:
            raise StateFileError("%s, and it cannot be moved aside (%s): move it away"
                                 % (why, exc.strerror or exc)) from exc
        log.warning("%s: moved aside to %s; starting from the coordinator's next global model, as "
                    "on a fresh state folder", why, aside)
