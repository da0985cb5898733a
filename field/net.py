"""The lab's network: a hub namespace with a bridge, one namespace per board, shaped veth links.

Everything lives in network namespaces this module creates and names with ``PREFIX``; the
addresses (``SUBNET``) exist only inside them and no namespace has a route anywhere else, so no
packet of the lab can leave the machine. Shaping, per board link:

- rate: ``tc qdisc ... tbf`` on both ends of the veth (the hub end shapes the downlink, the
  board end the uplink);
- loss: an nftables table in the board's namespace dropping ``numgen random mod 100 < N`` of the
  packets in each direction (this kernel has no ``netem``);
- delay: ``netem`` where the kernel has it, else the lab's TCP relay (``relay.py``) in the hub,
  which holds every chunk for the profile's one-way delay in each direction;
- a cut link: the veth's hub end taken down (and brought up again).

``Lab.applied()`` says which of these it really applied. ``cleanup_leftovers()`` removes what a
crashed earlier run left (its namespaces, and first the processes still inside them).
"""
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

log = logging.getLogger(__name__)

#: Every namespace, veth and nftables table of the lab starts with this, so a later run finds
#: (and removes) exactly what an earlier one left.
PREFIX = "sflf-"
HUB = PREFIX + "hub"
BRIDGE = "sflbr0"
#: A private /24 that exists only inside the lab's namespaces.
SUBNET = "10.213.77"
HUB_ADDR = SUBNET + ".1"
NFT_TABLE = "sflfield"


@dataclass(frozen=True)
class LinkProfile:
    """What one board's link does: rate (kbit/s), loss (% of packets each way), one-way delay."""

    name: str
    rate_kbit: int
    loss_pct: int
    delay_ms: int


#: A home Wi-Fi link of a board in the next room, and a cellular (LTE, weak signal) uplink.
WIFI = LinkProfile("wifi", rate_kbit=20000, loss_pct=1, delay_ms=5)
CELLULAR = LinkProfile("cellular", rate_kbit=2000, loss_pct=2, delay_ms=60)
PROFILES = {p.name: p for p in (WIFI, CELLULAR)}


def sh(*argv: str, check: bool = True, ns: Optional[str] = None,
       quiet: bool = False) -> subprocess.CompletedProcess:
    """Run one command (inside namespace ``ns`` if given); raise with its output on failure.
    ``quiet``: drop its stderr (``ip netns list`` run inside a namespace warns on each name)."""
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(argv)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True,
                          stderr=subprocess.DEVNULL if quiet else subprocess.STDOUT)
    if check and done.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), done.returncode, done.stdout.strip()))
    return done


def missing_prerequisites() -> List[str]:
    """What this machine lacks to run the lab, in words (empty: nothing)."""
    out = []
    if os.geteuid() != 0:
        out.append("not root (network namespaces need CAP_NET_ADMIN)")
    for tool, what in (("ip", "iproute2 (ip netns)"), ("tc", "iproute2 (tc)"),
                       ("nft", "nftables (apt-get install nftables)"),
                       ("unshare", "util-linux (unshare)"), ("mosquitto_passwd", "mosquitto"),
                       ("openssl", "openssl")):
        if shutil.which(tool) is None:
            out.append("no %s" % what)
    if not out:
        probe = PREFIX + "probe"
        done = sh("ip", "netns", "add", probe, check=False)
        if done.returncode != 0:
            out.append("ip netns add fails: %s" % done.stdout.strip())
        else:
            sh("ip", "netns", "del", probe, check=False)
    return out


def lab_namespaces() -> List[str]:
    done = sh("ip", "netns", "list", check=False, quiet=True)
    names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(PREFIX)]


def kill_namespace_processes(ns: str) -> int:
    """SIGKILL every process inside lab namespace ``ns`` (by pid); how many."""
    done = sh("ip", "netns", "pids", ns, check=False, quiet=True)
    n = 0
    for word in done.stdout.split():
        if word.isdigit() and int(word) != os.getpid():
            try:
                os.kill(int(word), signal.SIGKILL)
                n += 1
            except OSError:
                pass
    return n


def cleanup_leftovers() -> List[str]:
    """Remove every lab namespace (after killing what runs in it); the names removed."""
    names = lab_namespaces()
    for ns in names:
        if ns == HUB and os.environ.get("SFL_FIELD_INNER") == "1":
            continue  # the lab's own hub, where this process runs
        kill_namespace_processes(ns)
    if names:
        time.sleep(0.3)
    removed = []
    for ns in names:
        if ns == HUB and os.environ.get("SFL_FIELD_INNER") == "1":
            continue
        if sh("ip", "netns", "del", ns, check=False).returncode == 0:
            removed.append(ns)
    return removed


def netem_available() -> bool:
    """True where the kernel has the netem qdisc (tried on a throw-away dummy link in a namespace)."""
    ns = PREFIX + "netemprobe"
    if sh("ip", "netns", "add", ns, check=False).returncode != 0:
        return False
    try:
        sh("ip", "link", "add", "d0", "type", "dummy", ns=ns, check=False)
        return sh("tc", "qdisc", "add", "dev", "d0", "root", "netem", "delay", "1ms",
                  ns=ns, check=False).returncode == 0
    finally:
        sh("ip", "netns", "del", ns, check=False)


def create_hub() -> None:
    """The hub namespace with the bridge at ``HUB_ADDR`` (called from outside it)."""
    sh("ip", "netns", "add", HUB)
    sh("ip", "link", "set", "lo", "up", ns=HUB)
    sh("ip", "link", "add", BRIDGE, "type", "bridge", ns=HUB)
    sh("ip", "addr", "add", HUB_ADDR + "/24", "dev", BRIDGE, ns=HUB)
    sh("ip", "link", "set", BRIDGE, "up", ns=HUB)


def delete_hub() -> None:
    if HUB in lab_namespaces():
        kill_namespace_processes(HUB)
        time.sleep(0.2)
        sh("ip", "netns", "del", HUB, check=False)


class Board:
    """One board's namespace and link (created from inside the hub namespace)."""

    def __init__(self, index: int, name: str, profile: LinkProfile, netem: bool):
        self.index = index
        self.name = name
        self.ns = "%sb%02d" % (PREFIX, index)
        self.addr = "%s.%d" % (SUBNET, 10 + index)
        self.hub_if = "sflv%02d" % index
        self.profile = profile
        self.netem = netem
        self.loss_pct = profile.loss_pct
        self.up = True

    def create(self) -> None:
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "set", "lo", "up", ns=self.ns)
        sh("ip", "link", "add", self.hub_if, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        sh("ip", "link", "set", self.hub_if, "master", BRIDGE)
        sh("ip", "link", "set", self.hub_if, "up")
        sh("ip", "addr", "add", self.addr + "/24", "dev", "eth0", ns=self.ns)
        sh("ip", "link", "set", "eth0", "up", ns=self.ns)
        self.shape()
        self.set_loss(self.profile.loss_pct)

    def _qdisc(self, dev: str, ns: Optional[str]) -> None:
        rate = "%dkbit" % self.profile.rate_kbit
        # burst: at least one MTU and 10 ms at the rate; latency bounds the queue (a slow link
        # queues, it does not drop at once).
        burst = max(1600, self.profile.rate_kbit * 1000 // 8 // 100)
        sh("tc", "qdisc", "del", "dev", dev, "root", ns=ns, check=False)
        if self.netem:
            sh("tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay",
               "%dms" % self.profile.delay_ms, ns=ns)
            sh("tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "tbf", "rate", rate,
               "burst", str(burst), "latency", "400ms", ns=ns)
        else:
            sh("tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", str(burst),
               "latency", "400ms", ns=ns)

    def shape(self) -> None:
        self._qdisc(self.hub_if, None)
        self._qdisc("eth0", self.ns)

    def set_loss(self, pct: int) -> None:
        """Drop ``pct`` % of the packets each way (0: none), with nftables in the board's namespace."""
        sh("nft", "delete", "table", "inet", NFT_TABLE, ns=self.ns, check=False)
        self.loss_pct = int(pct)
        if pct <= 0:
            return
        script = ("table inet %s {\n"
                  " chain in { type filter hook input priority 0; policy accept;"
                  " iifname \"eth0\" numgen random mod 100 < %d drop; }\n"
                  " chain out { type filter hook output priority 0; policy accept;"
                  " oifname \"eth0\" numgen random mod 100 < %d drop; }\n"
                  "}\n") % (NFT_TABLE, pct, pct)
        done = subprocess.run(["ip", "netns", "exec", self.ns, "nft", "-f", "-"], input=script,
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            raise RuntimeError("nft in %s failed: %s" % (self.ns, done.stdout.strip()))

    def cut(self) -> None:
        sh("ip", "link", "set", self.hub_if, "down")
        self.up = False

    def restore(self) -> None:
        sh("ip", "link", "set", self.hub_if, "up")
        self.up = True

    def applied(self) -> Dict[str, object]:
        """What this link really does, read back from the kernel."""
        tc_hub = sh("tc", "qdisc", "show", "dev", self.hub_if, check=False).stdout.strip()
        nft = sh("nft", "list", "table", "inet", NFT_TABLE, ns=self.ns, check=False)
        return {"board": self.name, "ns": self.ns, "addr": self.addr, "profile": self.profile.name,
                "rate_kbit": self.profile.rate_kbit, "loss_pct": self.loss_pct,
                "delay_ms": self.profile.delay_ms,
                "delay_by": "netem" if self.netem else "relay",
                "loss_by": "nftables numgen" if nft.returncode == 0 else "none",
                "tc": tc_hub.splitlines()}

    def delete(self) -> None:
        kill_namespace_processes(self.ns)
        sh("ip", "netns", "del", self.ns, check=False)
