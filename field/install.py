"""The lab's installs: the built wheel (and a bumped one), a wheelhouse, one venv per process.

- ``build_wheel``: ``pip wheel --no-deps`` of the working tree (what would ship), and
  ``build_bumped_wheel`` the same from a copy of the tree whose ``setup.py`` says a higher version
  (the coordinator's mid-run upgrade).
- The wheelhouse (``.field-cache/wheelhouse-<hash>``): the wheels of the package's dependencies
  (the coordinator's with the ``server`` extra, as docs/deployment.md installs it) but torch, at
  the versions of the interpreter running the lab, fetched once with ``pip download``.
- The torch layer (``.field-cache/torch-layer``): torch is 700 MB; every venv sees one copy of
  it, the running interpreter's, through a ``.pth`` file naming a folder of links to torch and
  the distributions it requires (pip then counts torch as installed and leaves it alone).
- One venv per board and per coordinator (cached by the wheelhouse's contents): the
  dependencies from the wheelhouse, then the wheel, both ``--no-index --find-links``; the wheel
  is installed again on every run (``--force-reinstall --no-deps``), so a venv always runs the
  tree's code of this run.
"""
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Set, Tuple

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".field-cache"
#: The extras a coordinator is installed with (docs/deployment.md: ``pip install "streamfl[server]"``).
SERVER = ("server",)


def _run(argv: List[str], cwd: Path = ROOT, env: Dict[str, str] = None) -> str:
    done = subprocess.run(argv, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s" % (" ".join(argv[:4]), done.returncode, done.stdout[-3000:]))
    return done.stdout


def tree_version(root: Path = ROOT) -> str:
    match = re.search(r'version="([^"]+)"', (root / "setup.py").read_text())
    if not match:
        raise RuntimeError("setup.py names no version")
    return match.group(1)


def build_wheel(out: Path, root: Path = ROOT) -> Path:
    """``pip wheel --no-deps`` of ``root`` into ``out``; the wheel's path."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("streamfl-*.whl"):
        old.unlink()
    build = out / "build-tmp"
    shutil.rmtree(build, ignore_errors=True)
    # A copy of the tracked and untracked-but-not-ignored files: the build leaves build/ and
    # *.egg-info behind, which must not land in the working tree the others edit.
    _copy_tree(root, build)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(out), str(build)], cwd=out)
    shutil.rmtree(build, ignore_errors=True)
    wheels = sorted(out.glob("streamfl-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError("pip wheel made %d wheels in %s" % (len(wheels), out))
    return wheels[0]


def bumped_version(version: str) -> str:
    """``0.1.0`` -> ``0.1.1``: the next patch release."""
    parts = version.split(".")
    parts[-1] = str(int(re.match(r"\d+", parts[-1]).group(0)) + 1)
    return ".".join(parts)


def build_bumped_wheel(out: Path, root: Path = ROOT) -> Path:
    """A wheel from a copy of the tree whose setup.py has the next patch version."""
    copy = out / "tree-next"
    shutil.rmtree(copy, ignore_errors=True)
    _copy_tree(root, copy)
    setup = copy / "setup.py"
    old = tree_version(copy)
    setup.write_text(setup.read_text().replace('version="%s"' % old, 'version="%s"' % bumped_version(old)))
    wheel = build_wheel(out / "next", copy)
    shutil.rmtree(copy, ignore_errors=True)
    return wheel


def _copy_tree(root: Path, dest: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=str(root), stdout=subprocess.PIPE, check=False)
    names = [n for n in listed.stdout.decode().split("\0") if n] if listed.returncode == 0 else None
    if not names:  # not a git checkout (a copy): everything but what git would ignore anyway
        shutil.copytree(str(root), str(dest), ignore=shutil.ignore_patterns(
            ".git", ".venv", ".field-cache", "runs", "build", "dist", "*.egg-info", "__pycache__"))
        return
    for name in names:
        src = root / name
        if not src.is_file():
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(str(src), str(target))


def _requirements(dist: metadata.Distribution, extras: Tuple[str, ...] = ()) -> List[Tuple[str, Tuple[str, ...]]]:
    """``(name, its extras)`` of what ``dist`` requires, with what its ``extras`` add."""
    out = []
    for req in dist.requires or []:
        if ";" in req:
            marker = req.split(";", 1)[1]
            extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
            if extra and extra.group(1) not in extras:
                continue
        match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(\[([^\]]*)\])?", req)
        if match:
            wanted = tuple(e.strip() for e in (match.group(3) or "").split(",") if e.strip())
            out.append((match.group(1), wanted))
    return out


def _closure(todo: List[Tuple[str, Tuple[str, ...]]], skip: Set[str]) -> Dict[str, metadata.Distribution]:
    """Every installed distribution ``todo`` requires, transitively (``skip``: names left out)."""
    found: Dict[str, metadata.Distribution] = {}
    seen: Set[Tuple[str, Tuple[str, ...]]] = set()
    while todo:
        name, extras = todo.pop()
        key = name.lower().replace("_", "-")
        if key in skip or (key, extras) in seen:
            continue
        seen.add((key, extras))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found[key] = dist
        todo.extend(_requirements(dist, extras))
    return found


def pinned_dependencies(extras: Tuple[str, ...] = ()) -> List[str]:
    """``name==version`` of what streamfl (with ``extras``) requires, torch's tree excluded, and
    everything those require, at the versions installed in the interpreter running the lab."""
    found = _closure(_requirements(metadata.distribution("streamfl"), extras), {"torch"})
    return sorted("%s==%s" % (d.metadata["Name"], d.version) for d in found.values())


def wheelhouse() -> Path:
    """The wheels of the agent's and the coordinator's (``server`` extra) dependencies,
    downloaded once at the versions installed here."""
    pins = sorted(set(pinned_dependencies()) | set(pinned_dependencies(SERVER)))
    digest = hashlib.sha256("\n".join(pins).encode()).hexdigest()[:12]
    house = CACHE / ("wheelhouse-" + digest)
    if (house / ".complete").exists():
        return house
    for stale in CACHE.glob("wheelhouse-*"):  # an earlier run's, for other versions
        shutil.rmtree(stale, ignore_errors=True)
    house.mkdir(parents=True, exist_ok=True)
    log.info("downloading the dependencies' wheels into %s: %s", house, ", ".join(pins))
    _run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "--no-deps",
          "-d", str(house)] + pins)
    (house / ".complete").write_text("\n".join(pins) + "\n")
    return house


def torch_layer() -> Path:
    """A folder of links to this interpreter's torch and what it requires (one copy for all)."""
    layer = CACHE / "torch-layer"
    torch = metadata.distribution("torch")
    stamp = layer / (".torch-%s" % torch.version)
    if stamp.exists():
        return layer
    shutil.rmtree(layer, ignore_errors=True)
    layer.mkdir(parents=True)
    for dist in _closure([("torch", ())], set()).values():
        base = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in (dist.files or []) if not str(f).startswith("..")}
        for top in tops:
            src = base / top
            if top.endswith(".pth") or top == "__pycache__" or not src.exists():
                continue
            dest = layer / top
            if not dest.exists():
                os.symlink(str(src), str(dest))
    stamp.write_text(torch.version + "\n")
    return layer


def make_venv(path: Path, house: Path, layer: Path, extras: Tuple[str, ...] = ()) -> Path:
    """A venv at ``path`` with streamfl's (and ``extras``') dependencies from ``house`` and torch
    through ``layer``."""
    python = path / "bin" / "python"
    pins = pinned_dependencies(extras)
    key = hashlib.sha256(("%s\n" % house.name + "\n".join(pins)).encode()).hexdigest()[:12]
    if (path / (".deps-" + key)).exists() and python.exists():
        return python
    shutil.rmtree(path, ignore_errors=True)
    _run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    site = next((path / "lib").glob("python*/site-packages"))
    (site / "streamfl-field-torch-layer.pth").write_text(str(layer) + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index",
          "--find-links", str(house)] + pins)
    (path / (".deps-" + key)).write_text("\n".join(pins) + "\n")
    return python


def install_wheel(python: Path, wheel: Path, house: Path) -> str:
    """Install ``wheel`` into the venv of ``python`` (no index); the version it reports.

    A venv that holds this very wheel already (same sha256, from an earlier run) is left alone."""
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    marker = python.parent.parent / ".streamfl-wheel"
    if not (marker.exists() and marker.read_text().split()[0] == digest):
        if marker.exists():
            marker.unlink()
        _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index",
              "--find-links", str(house), "--force-reinstall", "--no-deps", str(wheel)])
        marker.write_text("%s %s\n" % (digest, wheel.name))
    out = _run([str(python), "-c", "from importlib.metadata import version; print(version('streamfl'))"],
               cwd=python.parent)
    return out.strip()
