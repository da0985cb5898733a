"""How an arm64 program runs on this x86-64 machine: qemu-user through binfmt_misc, else PRoot.

binfmt_misc (``qemu-user-static``'s ``qemu-aarch64`` entry, registered by ``update-binfmts``) lets
the kernel run any arm64 binary under qemu, so a plain ``chroot`` into the root folder works and
every child (pip, the agent, systemd-analyze) is emulated too. Where the kernel or the container
refuses the registration, PRoot (``proot -q qemu-aarch64-static``) does the same from user space,
slower. Each command runs in a private mount namespace (``unshare --mount``), where the root gets
its /proc, /dev and read-only /sys and the binds a caller asks for; they vanish with the process.
With ``net_cut`` it also gets a fresh network namespace whose only interface is ``lo``.
"""
import logging
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

log = logging.getLogger(__name__)

BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
BINFMT_ENTRY = "qemu-aarch64"
#: Where qemu-user-static puts the static emulator PRoot needs.
QEMU_STATIC = "qemu-aarch64-static"
#: The environment every command in a root starts from (``env -i``): nothing of the host's leaks in.
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
#: What to install where a tool is missing (Debian package names).
APT_HINT = "apt-get install debootstrap qemu-user-static binfmt-support proot"


class EmulationUnavailable(RuntimeError):
    """Neither binfmt_misc nor PRoot can run arm64 programs here."""


@dataclass(frozen=True)
class Bind:
    """A host folder seen at ``guest`` inside the root."""

    host: str
    guest: str
    read_only: bool = True


@dataclass
class Emulation:
    """``kind`` is ``binfmt`` or ``proot``; ``detail`` says how it was found (for the record)."""

    kind: str
    detail: str = ""
    #: binfmt without the F flag: the interpreter's host path, copied into each root.
    interpreter: Optional[str] = None
    notes: List[str] = field(default_factory=list)
    #: The core qemu emulates (``QEMU_CPU``, e.g. cortex-a72); None: qemu's default, "max".
    cpu: Optional[str] = None

    def for_cpu(self, cpu: Optional[str]) -> "Emulation":
        """The same emulation with qemu emulating ``cpu``."""
        return replace(self, cpu=cpu, notes=list(self.notes))

    def describe(self) -> str:
        words = ", ".join(w for w in (self.detail, "cpu %s" % self.cpu if self.cpu else "") if w)
        return "%s (%s)" % (self.kind, words) if words else self.kind

    def program_pid(self, pid: int) -> int:
        """The process that runs the program of ``command`` started as ``pid``: the same one
        under binfmt (every step execs the next); under PRoot its tracee, a child of proot, which
        proot does not pass signals on to (a killed proot leaves it running untraced)."""
        if self.kind != "proot":
            return pid
        kids = children(pid)
        return kids[0] if kids else pid

    def prepare_root(self, root: Path) -> None:
        """What a root needs before anything runs in it: the interpreter where binfmt lacks F."""
        if self.kind == "binfmt" and self.interpreter:
            dest = root / self.interpreter.lstrip("/")
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(self.interpreter, str(dest))

    def command(self, root: Path, argv: Sequence[str], binds: Sequence[Bind] = (),
                net_cut: bool = False, env: Optional[Dict[str, str]] = None,
                user: Optional[Tuple[int, int]] = None, mounts: bool = True) -> List[str]:
        """The host argv that runs ``argv`` inside ``root`` (as ``user`` (uid, gid) if given).

        ``mounts`` False: no /proc, /dev, /sys (debootstrap's second stage mounts its own)."""
        root = Path(root).resolve()
        env = dict(BASE_ENV, **(env or {}))
        if self.cpu:  # qemu-user reads it at each exec of an arm64 program
            env["QEMU_CPU"] = self.cpu
        inner = ["env", "-i"] + ["%s=%s" % kv for kv in sorted(env.items())]
        inner += list(argv)
        if self.kind == "binfmt":
            if user is not None:  # the root's own setpriv, so the root's groups apply
                inner = ["setpriv", "--reuid=%d" % user[0], "--regid=%d" % user[1], "--init-groups"] + inner
            return binfmt_command(root, inner, binds, net_cut, mounts)
        if self.kind == "proot":
            return proot_command(root, inner, binds, net_cut, mounts, user)
        raise ValueError("unknown emulation %r" % self.kind)


def children(pid: int) -> List[int]:
    """The child processes of ``pid``, oldest first (from /proc/*/stat)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 19 and int(fields[1]) == pid:
            out.append((int(fields[19]), int(entry.name)))  # start time, pid
    return [p for _, p in sorted(out)]


def _q(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(str(w)) for w in words)


def _bind_lines(root: Path, binds: Sequence[Bind]) -> List[str]:
    lines = []
    for b in binds:
        guest = "%s/%s" % (root, b.guest.lstrip("/"))
        lines.append("mkdir -p %s && mount --bind %s %s" % (_q([guest]), _q([b.host]), _q([guest])))
        if b.read_only:
            lines.append("mount -o remount,bind,ro %s" % _q([guest]))
    return lines


def binfmt_command(root: Path, inner: Sequence[str], binds: Sequence[Bind] = (),
                   net_cut: bool = False, mounts: bool = True) -> List[str]:
    """``unshare --mount [--net]``, the root's mounts, then ``exec chroot``: one process id from
    unshare to the program (each step execs the next), so a signal to it reaches the program."""
    root = Path(root)
    lines = ["set -e"]
    if net_cut:
        lines.append("ip link set lo up")
    if mounts:
        lines += ["mount -t proc proc %s" % _q([root / "proc"]),
                  "mount --rbind /dev %s" % _q([root / "dev"]),
                  "mount --rbind /sys %s" % _q([root / "sys"]),
                  "mount -o remount,bind,ro %s" % _q([root / "sys"])]
    lines += _bind_lines(root, binds)
    lines.append("exec chroot %s %s" % (_q([root]), _q(inner)))
    unshare = ["unshare", "--mount", "--propagation", "private"] + (["--net"] if net_cut else [])
    return unshare + ["--", "sh", "-c", "\n".join(lines)]


def proot_command(root: Path, inner: Sequence[str], binds: Sequence[Bind] = (),
                  net_cut: bool = False, mounts: bool = True,
                  user: Optional[Tuple[int, int]] = None) -> List[str]:
    """``proot -q qemu-aarch64-static -r ROOT`` with the same binds (PRoot cannot make a bind
    read-only), in a fresh network namespace when ``net_cut``. As ``user``, PRoot itself runs
    with those ids (the host's setpriv): a setpriv inside PRoot cannot change ids."""
    argv = ["proot"] + ([] if user is not None else ["-0"]) + ["-q", QEMU_STATIC, "-r", str(root), "-w", "/"]
    if mounts:
        argv += ["-b", "/proc", "-b", "/dev", "-b", "/sys"]
    for b in binds:
        argv += ["-b", "%s:%s" % (b.host, b.guest)]
    argv += list(inner)
    if user is not None:
        argv = ["setpriv", "--reuid=%d" % user[0], "--regid=%d" % user[1], "--clear-groups"] + argv
    if net_cut:
        return ["unshare", "--net", "--", "sh", "-c", "ip link set lo up && exec %s" % _q(argv)]
    return argv


def binfmt_flags(entry: Path) -> Optional[Tuple[bool, str, str]]:
    """``(enabled, interpreter, flags)`` of a binfmt_misc entry, None where it is not there."""
    try:
        text = entry.read_text()
    except OSError:
        return None
    enabled = text.splitlines()[0].strip() == "enabled" if text else False
    interp = flags = ""
    for line in text.splitlines():
        if line.startswith("interpreter "):
            interp = line.split(None, 1)[1].strip()
        elif line.startswith("flags:"):
            flags = line.split(":", 1)[1].strip()
    return enabled, interp, flags


def _try(argv: List[str]) -> bool:
    try:
        return subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    except OSError:
        return False


def detect(prefer: str = "auto", binfmt_dir: Path = BINFMT_DIR) -> Emulation:
    """binfmt_misc when it is (or can be made) usable, else PRoot; ``prefer`` forces one."""
    notes: List[str] = []
    if prefer in ("auto", "binfmt"):
        entry = binfmt_dir / BINFMT_ENTRY
        if not (binfmt_dir / "register").exists():
            if _try(["mount", "-t", "binfmt_misc", "binfmt_misc", str(binfmt_dir)]):
                notes.append("mounted binfmt_misc")
        if binfmt_flags(entry) is None or not binfmt_flags(entry)[0]:
            if shutil.which("update-binfmts") and _try(["update-binfmts", "--enable", BINFMT_ENTRY]):
                notes.append("update-binfmts --enable %s" % BINFMT_ENTRY)
        state = binfmt_flags(entry)
        if state is not None and state[0]:
            enabled, interp, flags = state
            detail = "binfmt_misc %s, interpreter %s, flags %s" % (BINFMT_ENTRY, interp, flags or "-")
            # Without F the kernel opens the interpreter inside the chroot: it must be there.
            emu = Emulation("binfmt", detail, None if "F" in flags else interp, notes)
            log.info("emulation: %s", emu.describe())
            return emu
        notes.append("binfmt_misc unusable here (no enabled %s entry)" % BINFMT_ENTRY)
        if prefer == "binfmt":
            raise EmulationUnavailable("; ".join(notes) + "; " + APT_HINT)
    if shutil.which("proot") and shutil.which(QEMU_STATIC):
        emu = Emulation("proot", "proot -q %s" % QEMU_STATIC, None, notes)
        log.info("emulation: %s", emu.describe())
        return emu
    raise EmulationUnavailable("no way to run arm64 programs: %s; install them with: %s" % (
        "; ".join(notes) or "binfmt not tried", APT_HINT))


def missing_tools(emulation_kind: str = "auto") -> List[str]:
    """Host programs the lab needs that are not on PATH."""
    need = ["debootstrap", "unshare", "chroot", "mount", "ip", "mosquitto", QEMU_STATIC]
    if emulation_kind == "proot":
        need.append("proot")
    return [n for n in need if not shutil.which(n) and not os.path.exists("/usr/sbin/%s" % n)]
