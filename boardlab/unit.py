"""The installed systemd unit: where the install put it, what it runs and as whom, and
``systemd-analyze verify`` of it inside the root.

The lab runs the agent as the unit would: its ``ExecStart`` command line, as its ``User=`` and
``Group=``, with its ``Environment=`` and its ``StateDirectory=`` made as systemd makes it, so
the run proves the installed layout, not a command line of the lab's own.
"""
import logging
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from emulation import Emulation

log = logging.getLogger(__name__)

UNIT_NAME = "streamfl-agent.service"
#: Where an install puts a unit, most specific first (paths inside the root).
UNIT_DIRS = ("etc/systemd/system", "usr/local/lib/systemd/system", "lib/systemd/system",
             "usr/lib/systemd/system")


@dataclass
class Unit:
    """What the lab needs of the unit file."""

    path_in_root: str
    exec_start: List[str]
    exec_stop_post: List[str] = field(default_factory=list)
    user: str = "root"
    group: Optional[str] = None
    state_directory: Optional[str] = None
    state_directory_mode: str = "0755"
    environment: Dict[str, str] = field(default_factory=dict)

    def option(self, name: str) -> Optional[str]:
        """The value of ``--name VALUE`` (or ``--name=VALUE``) in ExecStart."""
        argv = self.exec_start
        for i, word in enumerate(argv):
            if word == name and i + 1 < len(argv):
                return argv[i + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
        return None


def _command(value: str) -> List[str]:
    """An Exec line's argv without systemd's prefixes (``-``, ``@``, ``+``, ``!``, ``:``)."""
    argv = shlex.split(value)
    if argv:
        argv[0] = argv[0].lstrip("-@+!:")
    return argv


def parse_unit(text: str, path_in_root: str) -> Unit:
    """The [Service] keys the lab uses; the last assignment wins, as in systemd."""
    section = None
    keys: Dict[str, str] = {}
    env: Dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section != "Service" or "=" not in line:
            continue
        key, value = (s.strip() for s in line.split("=", 1))
        if key == "Environment":
            for word in shlex.split(value):
                if "=" in word:
                    k, v = word.split("=", 1)
                    env[k] = v
        else:
            keys[key] = value
    if "ExecStart" not in keys:
        raise ValueError("%s has no ExecStart" % path_in_root)
    return Unit(path_in_root=path_in_root, exec_start=_command(keys["ExecStart"]),
                exec_stop_post=_command(keys["ExecStopPost"]) if keys.get("ExecStopPost") else [],
                user=keys.get("User", "root"), group=keys.get("Group"),
                state_directory=(keys.get("StateDirectory", "").split() or [None])[0],
                state_directory_mode=keys.get("StateDirectoryMode", "0755"), environment=env)


def find_unit(root: Path) -> Optional[Unit]:
    for folder in UNIT_DIRS:
        path = root / folder / UNIT_NAME
        if path.is_file():
            return parse_unit(path.read_text(), "/%s/%s" % (folder, UNIT_NAME))
    return None


def ids(root: Path, user: str, group: Optional[str]) -> Tuple[int, int]:
    """``(uid, gid)`` of ``user`` (and ``group``, default the user's) in the root's own files."""
    uid = gid = None
    for line in (root / "etc/passwd").read_text().splitlines():
        parts = line.split(":")
        if len(parts) > 3 and parts[0] == user:
            uid, gid = int(parts[2]), int(parts[3])
    if uid is None:
        raise RuntimeError("the root has no user %r (the install should have made it)" % user)
    if group:
        for line in (root / "etc/group").read_text().splitlines():
            parts = line.split(":")
            if len(parts) > 2 and parts[0] == group:
                gid = int(parts[2])
    return uid, gid


def verify_argv(unit: Unit) -> List[str]:
    """``systemd-analyze verify`` of the installed unit, run inside the root under emulation:
    the root's own systemd (247 on bullseye, 252 on bookworm) judges the file."""
    return ["systemd-analyze", "verify", unit.path_in_root]


def verify(emulation: Emulation, root: Path, unit: Unit, logf: Path) -> Dict[str, object]:
    """Whether the root's systemd-analyze passes the unit (exit 0 and no line naming it)."""
    argv = emulation.command(root, verify_argv(unit))
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    text = done.stdout.decode(errors="replace")
    with open(logf, "a") as fh:
        fh.write("\n$ %s\n%s" % (" ".join(verify_argv(unit)), text))
    said = [re.sub(r"\x1b\[[0-9;]*m", "", l) for l in text.splitlines() if UNIT_NAME in l]
    return {"unit_verified": done.returncode == 0 and not said, "unit_verify_exit": done.returncode,
            "unit_verify_said": said[:5], "unit_verify_how": "systemd-analyze verify inside the root "
            "under %s" % emulation.kind, "unit_path": unit.path_in_root}
