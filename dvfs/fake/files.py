"""The file writer under the fake sysfs trees: attributes as sysfs prints them, and relative links.

Formats follow what sysfs prints (integer or text plus ``\\n``, lists with or
without the trailing space, DT properties as raw bytes).
"""
import os
from pathlib import Path
from typing import Sequence, Set, Union

#: Attribute modes seen on the boards.
RO, RW, ROOT_RO, WO, ROOT_RWX = 0o444, 0o644, 0o400, 0o200, 0o744

Content = Union[str, bytes]


class Tree:
    """Writes attributes (content plus the newline sysfs prints, or raw bytes) and relative
    links."""

    def __init__(self, root: Path):
        self.root = str(root)
        self._dirs: Set[str] = set()

    def _clear(self, rel: str) -> str:
        path = os.path.join(self.root, rel)
        parent = os.path.dirname(path)
        if parent not in self._dirs:
            os.makedirs(parent, exist_ok=True)
            self._dirs.add(parent)
        try:
            os.unlink(path)  # rebuilding over an earlier tree
        except FileNotFoundError:
            pass
        return path

    def put(self, rel: str, content: Content, mode: int = RO) -> None:
        path = self._clear(rel)
        with open(path, "wb") as f:
            f.write(content if isinstance(content, bytes) else (content + "\n").encode())
        os.chmod(path, mode)

    def link(self, rel: str, target: str) -> None:
        os.symlink(target, self._clear(rel))


def words(items: Sequence[object], trailing: bool) -> str:
    """A sysfs list: ``"%s "`` per item (trailing space) or space-joined (space truncated)."""
    return "".join("%s " % i for i in items) if trailing else " ".join(str(i) for i in items)
