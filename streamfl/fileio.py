"""Crash-safe file replacement (and reading back) shared by checkpoints, the outbox and the saved DVFS settings."""
import os
from pathlib import Path
from typing import Optional

from streamfl.errors import StorageError


def atomic_write(path: Path, data: bytes, sync_dir: bool = False) -> None:
    """Temp file, fsync, rename: a crash leaves the old file or the new one, never half of one.

    ``sync_dir`` also fsyncs the folder so the rename itself survives a power cut. Raises
    ``OSError`` (the caller knows what the file was for and translates it).
    """
    path = Path(path)
    tmp = path.with_name(".%s.tmp" % path.name)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    if sync_dir:
        dir_fd = os.open(str(path.parent), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def read_if_present(path: Path) -> Optional[bytes]:
    """The bytes of a state file, None if there is none; ``StorageError`` naming it if it cannot be
    read (the counterpart of ``atomic_write`` for files a run may or may not have left)."""
    path = Path(path)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError("cannot read %s: %s" % (path, exc.strerror or exc)) from exc
