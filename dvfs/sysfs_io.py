"""The real ``SysfsIO``: plain reads and single writes of attribute files under a sysfs root."""
import os
from pathlib import Path
from typing import List

from streamfl.dvfs.base import DvfsError, SysfsIO


class SysfsFiles(SysfsIO):
    """Attribute files under ``sysfs_root`` (``/sys`` on a board, a generated tree in tests).

    A write is one ``write(2)`` of ``value + "\\n"`` on a descriptor opened without ``O_CREAT``,
    exactly what ``echo value > file`` does, so a missing attribute is ENOENT rather than a new file.
    """

    def __init__(self, sysfs_root: Path = Path("/sys")):
        self.root = Path(sysfs_root)

    def path(self, rel_path: str) -> Path:
        return self.root / rel_path

    def read(self, rel_path: str) -> str:
        path = self.path(rel_path)
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise DvfsError("cannot read %s: %s" % (path, exc.strerror or exc), exc.errno or 0) from None
        text = raw.decode("utf-8", errors="replace")
        return text[:-1] if text.endswith("\n") else text

    def write(self, rel_path: str, value: str) -> None:
        path = self.path(rel_path)
        data = (value + "\n").encode("ascii")
        try:
            fd = os.open(str(path), os.O_WRONLY | os.O_TRUNC)
        except OSError as exc:
            raise DvfsError("cannot open %s for writing: %s" % (path, exc.strerror or exc),
                            exc.errno or 0) from None
        try:
            written = os.write(fd, data)
        except OSError as exc:
            raise DvfsError("writing %r to %s failed: %s" % (value, path, exc.strerror or exc),
                            exc.errno or 0) from None
        finally:
            os.close(fd)
        if written != len(data):
            raise DvfsError("short write of %r to %s" % (value, path))

    def exists(self, rel_path: str) -> bool:
        return os.path.exists(str(self.path(rel_path)))

    def listdir(self, rel_path: str) -> List[str]:
        try:
            return sorted(os.listdir(str(self.path(rel_path))))
        except OSError:
            return []
