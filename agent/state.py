"""The agent's state directory: local-model checkpoint (resume after a restart) and the outbox folder.

Layout: ``checkpoint.safetensors`` (weights + meta {global_version, round_index, device_id, arch_id},
written atomically) and ``outbox/``. Later issues add the DVFS originals here.
"""
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from streamfl.errors import StorageError
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
        """Create the folder and prove it is writable, else ``StorageError`` saying what to fix."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".probe-", dir=str(self.path))
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise StorageError(
                "state directory %s is not writable (%s): create it for the agent's user "
                "(e.g. systemd StateDirectory=streamfl-agent) or pass --state-dir"
                % (self.path, exc.strerror or exc)) from exc
        return self

    def save_checkpoint(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        """Write the local model atomically (a crash leaves the previous checkpoint intact)."""
        save_checkpoint(self.checkpoint_path, arrays, dict(meta))

    def load_checkpoint(self, arch_id: str) -> Optional[Tuple[Dict[str, np.ndarray], Dict[str, Any]]]:
        """The checkpoint if there is one for ``arch_id``; another arch or a damaged file is skipped."""
        path = self.checkpoint_path
        if not path.exists():
            return None
        try:
            arrays, meta = load_checkpoint(path)
        except StorageError as exc:
            log.warning("ignoring checkpoint: %s", exc)
            return None
        if meta.get("arch_id") != arch_id:
            log.warning("ignoring checkpoint %s of architecture %s: this agent runs %s",
                        path, meta.get("arch_id"), arch_id)
            return None
        return arrays, meta
