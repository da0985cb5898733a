"""A target's offline wheelhouse and board install script, as ``make dist`` builds them.

``make dist TARGETS=<target>`` (streamfl/deploy/dist.py) downloads the wheels for the target's
platform and Python once, on this machine, where the network is; the lab then hands the folder
to the install script inside the root with the network cut. ``--wheelhouse TARGET=DIR`` takes a
folder built elsewhere instead.
"""
import logging
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

from targets import Target

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
DIST = REPO / "dist"
SCRIPT = "install_board.sh"
#: The script in the source tree, used where the dist output carries no copy of its own.
SCRIPT_IN_TREE = REPO / "streamfl" / "deploy" / SCRIPT


def dist_argv(target: Target) -> List[str]:
    return ["make", "--no-print-directory", "dist", "TARGETS=%s" % target.name]


def find_wheelhouse(target: Target, dist: Path = DIST) -> Optional[Path]:
    """The folder under ``dist`` named for the target that holds wheels (the shallowest one)."""
    found = []
    for wheel in dist.rglob("*.whl"):
        folder = wheel.parent
        if target.name in str(folder.relative_to(dist)):
            found.append(folder)
    if not found:
        return None
    return min(set(found), key=lambda p: (len(p.parts), str(p)))


def find_script(wheelhouse: Path, dist: Path = DIST) -> Optional[Path]:
    """The install script: beside or above the wheelhouse in the dist output, else the tree's."""
    for folder in [wheelhouse] + list(wheelhouse.parents):
        if folder == dist.parent:
            break
        candidate = folder / SCRIPT
        if candidate.is_file():
            return candidate
    return SCRIPT_IN_TREE if SCRIPT_IN_TREE.is_file() else None


def build(target: Target, logf: Path) -> Dict[str, object]:
    """``make dist`` for the target; the wheelhouse, the script and the time it took."""
    started = time.monotonic()
    with open(logf, "ab") as fh:
        fh.write(("$ %s\n" % " ".join(dist_argv(target))).encode())
        fh.flush()
        done = subprocess.run(dist_argv(target), cwd=str(REPO), stdout=fh, stderr=subprocess.STDOUT)
    rec: Dict[str, object] = {"dist_s": round(time.monotonic() - started, 1), "dist_exit": done.returncode}
    if done.returncode != 0:
        rec["blocked"] = "make dist TARGETS=%s failed (%d): %s" % (
            target.name, done.returncode, " / ".join(logf.read_text(errors="replace").strip().splitlines()[-4:]))
        return rec
    house = find_wheelhouse(target)
    if house is None:
        rec["blocked"] = "make dist made no wheelhouse for %s under %s" % (target.name, DIST)
        return rec
    rec["wheelhouse"] = house
    rec["script"] = find_script(house)
    if rec["script"] is None:
        rec["blocked"] = "no %s in the dist output or the tree" % SCRIPT
    return rec
