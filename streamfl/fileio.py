"""Crash-safe file replacement shared by checkpoints, the outbox and the saved DVFS settings."""
import os
from pathlib import Path


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
