"""What ``streamfl-agent`` (``cli``) and ``streamfl-agent dvfs`` (``dvfs_cli``) share: the default
state folder and the one-line error exit.

It lives apart from ``cli`` so that ``dvfs_cli`` does not import ``cli``, which imports ``dvfs_cli``.
"""
import os
import sys
from pathlib import Path
from typing import Optional

PROG = "streamfl-agent"
SYSTEM_STATE_DIR = Path("/var/lib/streamfl-agent")


def default_state_dir(system_dir: Path = SYSTEM_STATE_DIR, home: Optional[Path] = None) -> Path:
    """``system_dir`` if it is (or can be made) writable by this user, else the per-user state dir."""
    if system_dir.is_dir():
        if os.access(str(system_dir), os.W_OK | os.X_OK):
            return system_dir
    elif os.access(str(system_dir.parent), os.W_OK | os.X_OK):
        return system_dir
    return (home or Path.home()) / ".local" / "state" / "streamfl-agent"


def fail(message: object, code: int) -> int:
    """Write ``streamfl-agent: error: <message>`` on one line to stderr; return ``code`` (exit code)."""
    sys.stderr.write("%s: error: %s\n" % (PROG, " ".join(str(message).split())))
    return code
