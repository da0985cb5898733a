"""The board install inside a root with the network cut, and what the installed agent reports.

The install script runs in the root under emulation, as root, in a fresh network namespace whose
only interface is ``lo`` (``Emulation.command(net_cut=True)``): pip can reach nothing but the
wheelhouse, which is bound read-only into the root with the script's own folder. A probe in the
same kind of namespace first shows the cut (its interfaces, and the address of the archive the
root was built from unreachable). Then, with the network still cut, the installed interpreter
says how long ``import streamfl.agent`` takes in a fresh process and which Python, torch and numpy
it runs.
"""
import json
import logging
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional
from urllib.parse import urlparse

from emulation import Bind, Emulation

log = logging.getLogger(__name__)

WHEELHOUSE_IN_ROOT = "/mnt/streamfl-wheelhouse"
SCRIPT_DIR_IN_ROOT = "/mnt/streamfl-install"
KIT_IN_ROOT = "/mnt/streamfl-kit"
#: The install script's default prefix (its venv is ``<prefix>/venv``).
PREFIX = "/opt/streamfl"

#: Run by the root's own python3 in the cut namespace: its interfaces and whether ``host:port``
#: answers (it must not).
NET_PROBE = r"""
import json, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
out = {"interfaces": sorted(n for _, n in socket.if_nameindex())}
try:
    socket.create_connection((host, port), timeout=5).close()
    out["reached"] = True
except OSError as exc:
    out["reached"] = False
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""

#: Run by the installed venv's python: import time of the agent, then the versions it runs.
#: ``streamfl.agent`` loads its modules lazily, so ``import_s`` is ``import streamfl.agent`` and
#: its ``AgentDaemon`` (what ``streamfl-agent`` loads before its first round: torch, numpy, paho);
#: ``package_only_import_s`` is the bare package. ``cpu_atomics``: whether the core has the ARMv8.1
#: atomics (HWCAP_ATOMICS), which a Pi 4's Cortex-A72 lacks; a matrix product runs on torch too.
IMPORT_PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
import streamfl.agent
lazy_s = time.perf_counter() - t0
from streamfl.agent import AgentDaemon
import_s = time.perf_counter() - t0
import torch, numpy, streamfl
import ctypes
hwcap = ctypes.CDLL(None).getauxval(16)  # AT_HWCAP, as the (emulated) core reports it
x = torch.randn(64, 64)
assert torch.isfinite(x @ x).all()
print(json.dumps({"import_s": round(import_s, 2), "package_only_import_s": round(lazy_s, 2),
                  "cpu_atomics": bool(hwcap & (1 << 8)),
                  "python": "%d.%d.%d" % sys.version_info[:3], "torch": torch.__version__,
                  "numpy": numpy.__version__, "streamfl": streamfl.__version__,
                  "machine": __import__("platform").machine()}))
"""


def install_argv(script_name: str, kit: bool, prefix: str = PREFIX) -> List[str]:
    """The install script's command line inside the root."""
    argv = ["sh", "%s/%s" % (SCRIPT_DIR_IN_ROOT, script_name), "--wheelhouse", WHEELHOUSE_IN_ROOT,
            "--prefix", prefix, "--python", "python3"]
    if kit:
        argv += ["--kit", KIT_IN_ROOT]
    return argv


def binds(script: Path, wheelhouse: Path, kit: Optional[Path]) -> List[Bind]:
    out = [Bind(str(script.parent), SCRIPT_DIR_IN_ROOT), Bind(str(wheelhouse), WHEELHOUSE_IN_ROOT)]
    if kit is not None:
        out.append(Bind(str(kit), KIT_IN_ROOT))
    return out


def _json_line(text: str) -> Optional[Dict[str, Any]]:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def _run(argv: List[str], logf: Path, timeout_s: float) -> subprocess.CompletedProcess:
    with open(logf, "ab") as fh:
        fh.write(("\n$ %s\n" % " ".join(argv)).encode())
        fh.flush()
        try:
            done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            fh.write(exc.output or b"")
            return subprocess.CompletedProcess(argv, 124, exc.output or b"")
        fh.write(done.stdout)
    return done


def network_probe(emulation: Emulation, root: Path, mirror: str, logf: Path) -> Dict[str, Any]:
    """What a program in the cut namespace sees: only ``lo``, and the archive host unreachable."""
    url = urlparse(mirror)
    port = url.port or (443 if url.scheme == "https" else 80)
    host = url.hostname or "localhost"
    try:  # resolved out here, so the probe tries the address itself, not only the name
        host = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except OSError:
        pass
    done = _run(emulation.command(root, ["python3", "-c", NET_PROBE, host, str(port)],
                                  net_cut=True), logf, 120)
    rec = _json_line(done.stdout.decode(errors="replace")) or {"error": "the probe printed nothing"}
    rec["cut"] = rec.get("interfaces") == ["lo"] and rec.get("reached") is False
    return rec


def install(emulation: Emulation, root: Path, script: Path, wheelhouse: Path, kit: Optional[Path],
            logf: Path, timeout_s: float = 3600.0) -> Dict[str, Any]:
    """Run the install script in the root with the network cut; its time and exit code.

    The script runs from a copy beside ``logf``: sh reads a script as it goes, so an edit of the
    original during the minutes pip takes under emulation would otherwise run half of each."""
    copy = logf.parent / "install-script" / script.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(str(script), str(copy))
    script = copy
    argv = emulation.command(root, install_argv(script.name, kit is not None),
                             binds(script, wheelhouse, kit), net_cut=True)
    started = time.monotonic()
    done = _run(argv, logf, timeout_s)
    rec = {"install_s": round(time.monotonic() - started, 1), "install_exit": done.returncode}
    if done.returncode != 0:
        rec["install_tail"] = done.stdout.decode(errors="replace")[-1500:]
    return rec


def import_probe(emulation: Emulation, root: Path, python_in_root: str, logf: Path) -> Dict[str, Any]:
    """The installed interpreter's import time of ``streamfl.agent`` and its versions (net cut)."""
    done = _run(emulation.command(root, [python_in_root, "-c", IMPORT_PROBE], net_cut=True), logf, 900)
    rec = _json_line(done.stdout.decode(errors="replace"))
    if rec is None or done.returncode != 0:
        return {"import_error": done.stdout.decode(errors="replace")[-1500:]}
    return rec


def root_python(emulation: Emulation, root: Path, logf: Path) -> Optional[str]:
    """The root's own python3 version (what the suite ships), or None where it does not run."""
    done = _run(emulation.command(root, ["python3", "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"]),
                logf, 300)
    text = done.stdout.decode(errors="replace").strip().splitlines()
    return text[-1] if done.returncode == 0 and text else None
