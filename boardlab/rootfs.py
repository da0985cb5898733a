"""The targets' arm64 root folders: ``debootstrap --foreign``, its second stage under emulation,
kept in ``.board-cache/<suite>-arm64/`` and built again only when the package list changes.

What a root holds (``PACKAGES``) is what the board install needs and nothing more: python3 (the
suite's own), python3-venv (ensurepip, so the install script makes a venv with pip; the script
also works without it), systemd (``systemd-analyze verify`` of the unit, and the unit's
directories) and ca-certificates. ``--variant=minbase`` keeps the rest to Debian's required set.
The mirror is Debian's archive as this machine's apt reaches it (``default_mirror``).
"""
import json
import logging
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from emulation import Emulation
from targets import Target

log = logging.getLogger(__name__)

PACKAGES = ("python3", "python3-venv", "systemd", "ca-certificates")
VARIANT = "minbase"
#: Debian's own archive, used when apt's sources name none.
FALLBACK_MIRROR = "http://deb.debian.org/debian"
APT_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
STAMP = "complete.json"


def default_mirror(sources: Sequence[Path] = APT_SOURCES) -> str:
    """The first Debian archive (a URI ending in /debian) that this machine's apt uses."""
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for uri in re.findall(r"(?m)^(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text):
            if uri.rstrip("/").endswith("/debian"):
                return uri.rstrip("/")
    return FALLBACK_MIRROR


def debootstrap_argv(suite: str, dest: Path, mirror: str, packages: Sequence[str] = PACKAGES,
                     variant: str = VARIANT) -> List[str]:
    """The first stage: download and unpack the arm64 packages on the host (nothing runs yet)."""
    return ["debootstrap", "--arch=arm64", "--foreign", "--variant=%s" % variant,
            "--include=%s" % ",".join(packages), suite, str(dest), mirror]


def second_stage_argv() -> List[str]:
    """The second stage, run inside the root under emulation: configure every package."""
    return ["/debootstrap/debootstrap", "--second-stage"]


def wanted(target: Target, mirror: str, packages: Sequence[str] = PACKAGES) -> Dict[str, object]:
    """What a cached root must have been built with to be reused."""
    return {"suite": target.suite, "arch": "arm64", "variant": VARIANT, "packages": list(packages),
            "mirror": mirror}


class RootCache:
    """``<cache>/<suite>-arm64/root`` per target, with a stamp saying how it was built."""

    def __init__(self, cache: Path, emulation: Emulation, mirror: Optional[str] = None):
        self.cache = Path(cache)
        self.emulation = emulation
        self.mirror = mirror or default_mirror()

    def folder(self, target: Target) -> Path:
        return self.cache / target.cache_name

    def root(self, target: Target) -> Path:
        return self.folder(target) / "root"

    def cached(self, target: Target) -> Optional[Dict[str, object]]:
        """The stamp of a usable cached root, None where it must be built."""
        stamp = self.folder(target) / STAMP
        try:
            rec = json.loads(stamp.read_text())
        except (OSError, ValueError):
            return None
        want = wanted(target, self.mirror)
        same = all(rec.get(k) == v for k, v in want.items() if k != "mirror")
        return rec if same and (self.root(target) / "usr/bin").is_dir() else None

    def ensure(self, target: Target) -> Dict[str, object]:
        """The target's root, built when no usable one is cached; its stamp (with ``build_s``,
        and ``cached`` True when nothing was built now)."""
        rec = self.cached(target)
        if rec is not None:
            self.emulation.prepare_root(self.root(target))
            return dict(rec, cached=True)
        folder = self.folder(target)
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / "root.partial"
        shutil.rmtree(str(partial), ignore_errors=True)
        shutil.rmtree(str(self.root(target)), ignore_errors=True)
        started = time.monotonic()
        logf = folder / "build.log"
        log.info("%s: debootstrap %s arm64 from %s (first stage)", target.name, target.suite, self.mirror)
        self._run(debootstrap_argv(target.suite, partial, self.mirror), logf)
        first_s = time.monotonic() - started
        self.emulation.prepare_root(partial)
        log.info("%s: second stage under %s", target.name, self.emulation.kind)
        self._run(self.emulation.command(partial, second_stage_argv(), mounts=False), logf)
        return self.finish(target, first_s, time.monotonic() - started)

    def finish(self, target: Target, first_stage_s: Optional[float], build_s: float) -> Dict[str, object]:
        """Move a finished ``root.partial`` into place and write its stamp."""
        folder = self.folder(target)
        (folder / "root.partial").rename(self.root(target))
        rec = dict(wanted(target, self.mirror), first_stage_s=None if first_stage_s is None else round(first_stage_s, 1),
                   build_s=round(build_s, 1), built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   emulation=self.emulation.kind)
        (folder / STAMP).write_text(json.dumps(rec, indent=1) + "\n")
        return dict(rec, cached=False)

    @staticmethod
    def _run(argv: List[str], logf: Path) -> None:
        with open(logf, "ab") as fh:
            fh.write(("$ %s\n" % " ".join(argv)).encode())
            fh.flush()
            done = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            tail = logf.read_text(errors="replace")[-2000:]
            raise RuntimeError("%s failed (%d); the end of %s:\n%s" % (argv[0], done.returncode, logf, tail))
