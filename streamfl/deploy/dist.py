"""``make dist``: the streamfl wheel and, per board OS, an offline wheelhouse the install script uses.

Each wheelhouse (``dist/wheelhouse/<target>/``) holds the streamfl wheel, the wheels of what the
agent requires (the wheel's own ``Requires-Dist``, with the target's extra), pip itself (Debian's
python3 has no ``ensurepip`` without ``python3-venv``: the install script bootstraps pip from its
wheel), torch where the target takes it from the package index, ``install_board.sh`` and
``target.json`` (target, Python, platform tags, torch included or not, every file with its sha256).
Wheels are fetched with ``pip download --only-binary=:all: --platform ... --python-version ...
--implementation cp``: pip picks, for each requirement, the newest release with a wheel for that
Python and machine, so nothing is pinned by hand but where ``TARGETS`` says why.

``pip download --platform`` evaluates requirement markers against the machine running it, not the
board: on an x86-64 build machine with Python 3.11 it would fetch torch's ``platform_machine ==
"x86_64"`` CUDA packages for an arm64 board, and miss what a marker gives only older Pythons
(cryptography's ``typing-extensions; python_full_version < '3.11'``). So torch is downloaded apart
(``--no-deps``) with its requirements evaluated for the target, and after the download every
wheel's requirements are evaluated for the target and what none of the wheels satisfies is
downloaded too (``close_requirements``), until nothing is missing.

A rerun with the same inputs downloads nothing (``.downloads.json`` in each wheelhouse records
them); only the streamfl wheel, the script and ``target.json`` are written again.
"""
import argparse
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version
except ImportError:  # pip always carries a copy
    from pip._vendor.packaging.requirements import Requirement  # type: ignore
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore
    from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore

from streamfl.deploy import INSTALL_SCRIPT, install_script

log = logging.getLogger(__name__)

#: Oldest manylinux glibc of the platform tags offered to pip (manylinux2014 = glibc 2.17).
MANYLINUX_OLDEST_GLIBC_MINOR = 17
#: The pure-Python requirements of NVIDIA's JetPack torch wheels (2.x), put into the wheelhouses
#: that leave torch out, so that a torch wheel dropped in beside them installs with no network.
NVIDIA_TORCH_REQUIRES = ("filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec")
#: Distribution names that mark a CUDA build of torch (several GB a board without an NVIDIA GPU
#: cannot use).
CUDA_PREFIXES = ("nvidia-", "cuda-", "triton")


class DistError(RuntimeError):
    """A wheelhouse that cannot be built as asked (unknown target, pip failed, a CUDA torch)."""

    exit_code = 2


class Target:
    """One board OS: its Python and machine, where torch comes from, what else it needs.

    ``glibc`` is the OS's C library (manylinux tags up to it are accepted); ``None`` means this
    machine (no ``--platform``: tests, an x86-64 edge box). ``torch`` is the requirement downloaded
    from the index, or ``None`` when NVIDIA's wheel is used instead (left out). ``pins`` are extra
    requirements with a reason in ``TARGETS``.
    """

    def __init__(self, name: str, os_name: str, python: str, glibc: Optional[Tuple[int, int]],
                 machine: str = "aarch64", torch: Optional[str] = None, extras: Sequence[str] = (),
                 pins: Sequence[str] = (), torch_support: Sequence[str] = ()):
        self.name = name
        self.os_name = os_name
        self.python = python
        self.glibc = glibc
        self.machine = machine
        self.torch = torch
        self.extras = tuple(extras)
        self.pins = tuple(pins)
        self.torch_support = tuple(torch_support)

    def platforms(self) -> List[str]:
        """pip's ``--platform`` tags: every manylinux glibc from the OS's down to 2.17."""
        if self.glibc is None:
            return []
        major, minor = self.glibc
        tags = ["manylinux_%d_%d_%s" % (major, m, self.machine)
                for m in range(minor, MANYLINUX_OLDEST_GLIBC_MINOR - 1, -1)]
        return tags + ["manylinux2014_%s" % self.machine]

    def pip_args(self) -> List[str]:
        """The arguments that make ``pip download`` fetch this target's wheels."""
        args = ["--only-binary=:all:"]
        if self.glibc is not None:
            args += ["--implementation", "cp", "--python-version", self.python]
            for tag in self.platforms():
                args += ["--platform", tag]
        return args

    def marker_environment(self) -> Dict[str, str]:
        """PEP 508 marker values on the board (not on the machine running make dist)."""
        return {"implementation_name": "cpython", "implementation_version": self.python + ".0",
                "os_name": "posix", "platform_machine": self.machine, "platform_release": "",
                "platform_system": "Linux", "platform_version": "",
                "platform_python_implementation": "CPython",
                "python_full_version": self.python + ".0", "python_version": self.python,
                "sys_platform": "linux", "extra": ""}

    def describe(self) -> Dict[str, object]:
        return {"target": self.name, "os": self.os_name, "python": self.python,
                "machine": self.machine, "platforms": self.platforms(),
                "torch_included": self.torch is not None, "torch_requirement": self.torch,
                "extras": list(self.extras), "pins": list(self.pins)}


#: The board OSes the docs name (docs/deployment.md, section 3), the one table of them.
#:
#: - torch ``<2.10`` on Raspberry Pi OS and Debian. From 2.11 on, PyPI's Linux aarch64 torch wheel
#:   is a CUDA 13 build that requires the ``cuda-toolkit`` and ``nvidia-*`` wheels (gigabytes,
#:   useless on a Pi; ``check_torch_requires`` refuses one on every build). 2.10, the last CPU-only
#:   one, dies with SIGILL at ``import torch`` on ARMv8.0 cores without the LSE atomics (Raspberry
#:   Pi 4's Cortex-A72, Pi 3's and Zero 2's A53): its bundled mimalloc was built with them
#:   (PyTorch's bug "ARMv8.1 LSE regression for ARMv8.0 devices"; seen here under
#:   ``qemu-aarch64-static -cpu cortex-a72``, where 2.9.1 and 2.8.0 import and multiply). So 2.9.
#:   Bullseye's Python 3.9 gets 2.8, the newest with cp39 aarch64 wheels, by resolution alone.
#: - ``numpy<2`` on JetPack 6: NVIDIA's JetPack 6 torch wheels (2.3 to 2.5) are built against NumPy
#:   1.x, which a NumPy 2 cannot load modules for; JetPack 5's Python 3.8 has no NumPy 2 at all.
#: - glibc: bookworm 2.36, bullseye 2.31, JetPack 6 (Ubuntu 22.04) 2.35, JetPack 5 (Ubuntu 20.04)
#:   2.31.
TARGETS = {t.name: t for t in (
    Target("rpios-bookworm-aarch64", "Raspberry Pi OS bookworm / Debian 12 (64-bit)", "3.11",
           (2, 36), torch="torch>=1.10,<2.10"),
    Target("debian-bullseye-aarch64", "Raspberry Pi OS bullseye / Debian 11 (64-bit)", "3.9",
           (2, 31), torch="torch>=1.10,<2.10"),
    Target("jetpack6", "NVIDIA JetPack 6 (L4T R36, Ubuntu 22.04)", "3.10", (2, 35),
           extras=("jetson",), pins=("numpy<2",), torch_support=NVIDIA_TORCH_REQUIRES),
    Target("jetpack5", "NVIDIA JetPack 5 (L4T R35, Ubuntu 20.04)", "3.8", (2, 31),
           extras=("jetson",), torch_support=NVIDIA_TORCH_REQUIRES),
)}


def host_target(name: str = "host", torch: Optional[str] = None) -> Target:
    """This machine's Python and platform (pip's own tags), torch left out unless named."""
    import platform
    return Target(name, "this machine", "%d.%d" % sys.version_info[:2], None,
                  machine=platform.machine(), torch=torch)


def _run(argv: List[str], cwd: Optional[Path] = None) -> str:
    log.debug("running %s", " ".join(argv))
    done = subprocess.run(argv, cwd=None if cwd is None else str(cwd), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True)
    if done.returncode != 0:
        raise DistError("%s failed (exit %d):\n%s" % (" ".join(argv[:5]), done.returncode,
                                                      done.stdout[-4000:]))
    return done.stdout


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(str(path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _tree_files(tree: Path) -> Optional[List[str]]:
    """The checkout's tracked and not-ignored files (what a clean clone has), or None off git."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=str(tree), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    names = [n for n in listed.stdout.decode().split("\0") if n] if listed.returncode == 0 else []
    return names or None


def can_build_here() -> bool:
    """Whether this interpreter's setuptools can build the wheel itself (offline, no isolated build
    env): pyproject.toml asks for setuptools >= 64, and a ``bdist_wheel`` comes with setuptools
    70.1 and later, before that with the ``wheel`` package. Otherwise pip fetches both."""
    from importlib import metadata
    try:
        found = metadata.version("setuptools")
    except metadata.PackageNotFoundError:
        return False
    version = tuple(int(x) for x in re.findall(r"\d+", found)[:2])
    if version < (64, 0):
        return False
    return version >= (70, 1) or importlib.util.find_spec("wheel") is not None


def build_wheel(tree: Path, out: Path) -> Path:
    """``pip wheel --no-deps`` of a copy of ``tree`` (its build/ and egg-info leftovers can hide a
    packaging mistake and must not land in the tree) into ``out``; the wheel's path."""
    out.mkdir(parents=True, exist_ok=True)
    staging = out / ".wheel-build"
    shutil.rmtree(str(staging), ignore_errors=True)
    names = _tree_files(tree)
    if names is None:
        shutil.copytree(str(tree), str(staging / "src"), ignore=shutil.ignore_patterns(
            ".git", ".venv", ".field-cache", "runs", "build", "dist", "*.egg-info", "__pycache__"))
    else:
        for name in names:
            src = tree / name
            if src.is_file():
                (staging / "src" / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(str(src), str(staging / "src" / name))
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(staging / "out")]
    if can_build_here():
        argv.append("--no-build-isolation")
    _run(argv + [str(staging / "src")], cwd=staging)
    built = sorted((staging / "out").glob("streamfl-*.whl"))
    if len(built) != 1:
        raise DistError("pip wheel made %d streamfl wheels" % len(built))
    for old in out.glob("streamfl-*.whl"):
        old.unlink()
    wheel = out / built[0].name
    shutil.move(str(built[0]), str(wheel))
    shutil.rmtree(str(staging), ignore_errors=True)
    return wheel


def wheel_metadata(wheel: Path) -> Dict[str, List[str]]:
    """The ``METADATA`` headers of a wheel, each name to its values."""
    with zipfile.ZipFile(str(wheel)) as zf:
        name = next((n for n in zf.namelist() if re.match(r"[^/]+\.dist-info/METADATA$", n)), None)
        if name is None:
            raise DistError("%s has no METADATA" % wheel.name)
        text = zf.read(name).decode("utf-8")
    out: Dict[str, List[str]] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        if ":" in line and not line.startswith((" ", "\t")):
            key, value = line.split(":", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def requirements_for(wheel: Path, env: Dict[str, str], extras: Sequence[str] = ()) -> List[Requirement]:
    """What ``wheel`` requires on a machine with markers ``env``, with ``extras``."""
    out = []
    for line in wheel_metadata(wheel).get("Requires-Dist", []):
        req = Requirement(line)
        if req.marker is None:
            out.append(req)
            continue
        for extra in ("",) + tuple(extras):
            if req.marker.evaluate(dict(env, extra=extra)):
                out.append(req)
                break
    return out


def _plain(req: Requirement) -> str:
    """The requirement without its marker (already evaluated for the target)."""
    return "%s%s%s" % (req.name, "[%s]" % ",".join(sorted(req.extras)) if req.extras else "",
                       req.specifier)


def check_torch_requires(torch_wheel: Path, target: Target) -> List[Requirement]:
    """torch's requirements on the target; a CUDA build (what PyPI's aarch64 wheel is from 2.11)
    is an error rather than gigabytes of CUDA wheels in a Raspberry Pi's wheelhouse."""
    reqs = requirements_for(torch_wheel, target.marker_environment())
    cuda = [r.name for r in reqs if canonicalize_name(r.name).startswith(CUDA_PREFIXES)]
    if cuda:
        raise DistError("%s for %s is a CUDA build (it requires %s): lower the torch cap of %s in "
                        "streamfl/deploy/dist.py TARGETS" % (torch_wheel.name, target.name,
                                                            ", ".join(cuda[:4]), target.name))
    return reqs


def _pip_download(target: Target, requirements: List[str], dest: Path, index_args: Sequence[str],
                  no_deps: bool = False) -> None:
    argv = [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest)] + target.pip_args()
    argv += list(index_args) + (["--no-deps"] if no_deps else []) + requirements
    _run(argv)


#: Bumped when what a download fetches changes (the cache key includes it).
DOWNLOAD_FORMAT = 2
#: Rounds of ``close_requirements`` before a wheelhouse that keeps missing something is an error.
CLOSE_ROUNDS_MAX = 5


def _wheel_name_version(filename: str) -> Tuple[str, Optional[Version]]:
    """``(canonical name, version)`` from a wheel's file name."""
    parts = filename.split("-")
    try:
        return canonicalize_name(parts[0]), Version(parts[1])
    except (IndexError, InvalidVersion):
        return canonicalize_name(parts[0]), None


def missing_requirements(target: Target, folder: Path, top: Sequence[str]) -> List[str]:
    """Requirements (``top``, and every wheel's in ``folder``, markers evaluated for the target)
    that no wheel in ``folder`` satisfies."""
    have: Dict[str, List[Version]] = {}
    wheels = sorted(folder.glob("*.whl"))
    for wheel in wheels:
        name, version = _wheel_name_version(wheel.name)
        if version is not None:
            have.setdefault(name, []).append(version)
    env = target.marker_environment()
    reqs = [Requirement(t) for t in top]
    for wheel in wheels:
        if not wheel.name.startswith("streamfl-"):
            reqs.extend(requirements_for(wheel, env))
    missing = []
    for req in reqs:
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        found = have.get(canonicalize_name(req.name), [])
        if not any(req.specifier.contains(v, prereleases=True) for v in found):
            text = _plain(req)
            if text not in missing:
                missing.append(text)
    return missing


def close_requirements(target: Target, folder: Path, top: Sequence[str], index_args: Sequence[str]) -> None:
    """Download what the wheels in ``folder`` require on the target and none of them satisfies."""
    for _ in range(CLOSE_ROUNDS_MAX):
        missing = missing_requirements(target, folder, top)
        if not missing:
            return
        log.info("%s: also downloading %s (required on the target)", target.name, ", ".join(missing))
        _pip_download(target, missing, folder, index_args)
    missing = missing_requirements(target, folder, top)
    if missing:
        raise DistError("%s: still missing %s after %d rounds" % (target.name, ", ".join(missing), CLOSE_ROUNDS_MAX))


def _download_key(target: Target, wheel_requires: List[str], index_args: Sequence[str]) -> str:
    blob = json.dumps({"format": DOWNLOAD_FORMAT, "target": target.describe(), "support": list(target.torch_support),
                       "requires": sorted(wheel_requires), "index": list(index_args)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _listed(house: Path) -> List[str]:
    """The files the last build put there (target.json's list)."""
    try:
        return [f["name"] for f in json.loads((house / "target.json").read_text())["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def download_wheels(target: Target, wheel: Path, house: Path, index_args: Sequence[str] = ()) -> List[str]:
    """The target's dependency wheels in ``house`` (cached); their file names."""
    env = target.marker_environment()
    own = [r for r in requirements_for(wheel, env, target.extras) if canonicalize_name(r.name) != "torch"]
    wanted = [_plain(r) for r in own] + list(target.pins)
    key = _download_key(target, wanted, index_args)
    record = house / ".downloads.json"
    try:
        cached = json.loads(record.read_text())
        if cached.get("key") == key and all((house / n).is_file() for n in cached["files"]):
            log.info("%s: wheels cached", target.name)
            return list(cached["files"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    staging = house.parent / (".staging-" + target.name)
    shutil.rmtree(str(staging), ignore_errors=True)
    staging.mkdir(parents=True)
    reuse = ["--find-links", str(house)] if house.is_dir() else []
    if target.torch is not None:
        _pip_download(target, [target.torch], staging, list(index_args) + reuse, no_deps=True)
        torch_wheels = sorted(staging.glob("torch-*.whl"))
        if len(torch_wheels) != 1:
            raise DistError("pip download %s for %s gave %d wheels" % (target.torch, target.name, len(torch_wheels)))
        wanted += [_plain(r) for r in check_torch_requires(torch_wheels[0], target)]
    else:
        wanted += list(target.torch_support)
    log.info("%s: downloading %s", target.name, ", ".join(wanted))
    _pip_download(target, wanted + ["pip"], staging, list(index_args) + reuse)
    close_requirements(target, staging, wanted, list(index_args) + reuse)
    if target.torch is not None:
        check_torch_requires(sorted(staging.glob("torch-*.whl"))[-1], target)
    files = sorted(p.name for p in staging.iterdir() if p.is_file() and p.name.endswith(".whl"))
    # A file someone put there (NVIDIA's torch wheel) that no build made is kept.
    if house.is_dir():
        ours = set(_listed(house)) | {INSTALL_SCRIPT, "target.json", ".downloads.json"}
        for extra in house.iterdir():
            if extra.is_file() and extra.name not in ours and not (staging / extra.name).exists():
                shutil.copy2(str(extra), str(staging / extra.name))
        shutil.rmtree(str(house))
    staging.rename(house)
    record.write_text(json.dumps({"key": key, "files": files}, indent=1) + "\n")
    return files


def build_wheelhouse(target: Target, wheel: Path, out: Path, index_args: Sequence[str] = ()) -> Path:
    """``out/<target>/``: the dependency wheels, the streamfl wheel, the install script and
    target.json; its path."""
    house = out / target.name
    started = time.monotonic()
    files = download_wheels(target, wheel, house, index_args)
    pips = [n for n in files if re.match(r"pip-[^-]+-py3-none-any\.whl$", n)]
    if len(pips) != 1:
        raise DistError("%s: expected one pip wheel, got %s" % (target.name, pips))
    for old in house.glob("streamfl-*.whl"):
        old.unlink()
    shutil.copy2(str(wheel), str(house / wheel.name))
    install_script(house)
    listed = sorted(set(files) | {wheel.name, INSTALL_SCRIPT})
    torch = [n for n in listed if n.startswith("torch-")]
    meta = wheel_metadata(wheel)
    info = dict(target.describe())
    info.update({
        "version": meta["Version"][0], "wheel": wheel.name, "pip_wheel": pips[0],
        "torch_wheel": torch[0] if torch else None, "built_by": "make dist",
        "files": [{"name": n, "sha256": sha256_file(house / n), "bytes": (house / n).stat().st_size}
                  for n in listed]})
    (house / "target.json").write_text(json.dumps(info, indent=1) + "\n")
    log.info("%s: %d files, %.1f MB, %.1f s", target.name, len(listed),
             sum(f["bytes"] for f in info["files"]) / 1e6, time.monotonic() - started)
    return house


def _targets(names: str) -> List[Target]:
    if names in ("", "all"):
        return list(TARGETS.values())
    out = []
    for name in (n.strip() for n in names.split(",")):
        if name == "host":
            out.append(host_target())
        elif name in TARGETS:
            out.append(TARGETS[name])
        else:
            raise DistError("unknown target %r: one of %s, host or all" % (name, ", ".join(TARGETS)))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamfl.deploy.dist", description=(
        "Build the streamfl wheel and an offline wheelhouse per board OS (make dist)."))
    parser.add_argument("--out", type=Path, default=Path("dist"), help="output folder (default dist)")
    parser.add_argument("--tree", type=Path, default=Path("."), help="the checkout to build (default .)")
    parser.add_argument("--targets", default="all",
                        help="comma-separated targets, 'host' (this machine) or all: %s" % ", ".join(TARGETS))
    parser.add_argument("--list", action="store_true", help="print the target table as JSON and exit")
    parser.add_argument("--pip-arg", action="append", default=[], metavar="ARG",
                        help="an extra argument for pip download (an --index-url, --find-links ...)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="dist: %(message)s")
    try:
        targets = _targets(args.targets)
        if args.list:
            print(json.dumps([t.describe() for t in targets], indent=1))
            return 0
        started = time.monotonic()
        wheel = build_wheel(args.tree.resolve(), args.out.resolve())
        log.info("built %s (%.1f s)", wheel, time.monotonic() - started)
        for target in targets:
            house = build_wheelhouse(target, wheel, args.out.resolve() / "wheelhouse", args.pip_arg)
            print(house)
    except DistError as exc:
        sys.stderr.write("dist: error: %s\n" % exc)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
