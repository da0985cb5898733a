"""A fake kernel over a fake sysfs tree: plain files, plus the rules the real kernel applies.

``FakeKernel`` implements ``SysfsIO`` on a directory built by ``streamfl.dvfs.fake.tree`` and copies
the behaviours of the real cpufreq and devfreq cores (governor targets clamped into the limits,
limit stores on 4.9 and on freq-QoS kernels, file modes and EBUSY/EAGAIN reads), so backends meet
the errors and read-backs of a board. State lives in the files, so another process may change the
tree with plain writes; only what the kernel keeps outside sysfs (the freq-QoS min
request, the userspace governor's target) sits in a side table.
"""
import errno
import logging
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from streamfl.dvfs.base import SysfsIO
from streamfl.dvfs.fake.values import (UINT, clamp, cpu_ranges, parse_token, parse_uint,
                                      pick_cpufreq, pick_opp, sysfs_error)

log = logging.getLogger(__name__)

_CPU = "devices/system/cpu/"
_POLICY = re.compile(r"^devices/system/cpu/cpufreq/policy\d+(?=/)")
_CPU_ONLINE = re.compile(r"^devices/system/cpu/cpu(\d+)/online$")
_DEVFREQ = re.compile(r"^.+/devfreq/[^/]+(?=/)")
#: Larger than any frequency: a 4.9 devfreq limit of 0 means "none".
_NO_LIMIT = 1 << 64


class FakeKernel(SysfsIO):
    """``SysfsIO`` over a fake tree that enforces the kernel's sysfs rules on every access.

    ``legacy_limits`` selects 4.9 semantics (min/max crossing is EINVAL, devfreq limit 0 = none)
    instead of freq-QoS (max wins, the min request comes back). Without ``as_root`` the caller is
    an unprivileged member of each file's group: it reads files with a group or other read bit and
    writes files with a group or other write bit (systemd/70-streamfl-dvfs.rules makes them 0664).
    Reads of ``eagain_paths`` (relative, symlinks allowed) raise EAGAIN like failing thermal zones.
    """

    def __init__(self, sysfs_root: Path, legacy_limits: bool = False, as_root: bool = True,
                 eagain_paths: Iterable[str] = ()):
        self.root = Path(sysfs_root)
        self.legacy_limits = legacy_limits
        self.as_root = as_root
        self.eagain_paths = tuple(eagain_paths)
        # (policy or devfreq dir, key) -> (request, value written when it was recorded)
        self._requests: Dict[Tuple[str, str], Tuple[int, int]] = {}
        self._lock = threading.RLock()

    # -- SysfsIO ---------------------------------------------------------------------------------

    def read(self, rel_path: str) -> str:
        """The attribute's text without its final newline, or the errno the kernel would give."""
        with self._lock:
            rel = self._open(rel_path, 0o444, 0o044)
            if rel in {self._locate(p)[0] for p in self.eagain_paths}:
                raise sysfs_error(errno.EAGAIN, rel_path, "sensor not ready")
            pol = _POLICY.match(rel)
            if pol:
                self._check_active(pol.group(0), rel_path)
                shown = self._cpufreq_show(pol.group(0), rel[pol.end() + 1:])
                if shown is not None:
                    return shown
            dev = _DEVFREQ.match(rel)
            if dev and rel[dev.end() + 1:] in ("cur_freq", "target_freq"):
                return str(self._devfreq_cur(dev.group(0)))
            return self._get(rel)

    def write(self, rel_path: str, value: str) -> None:
        """One store: the attribute's rule runs, the files it changes are rewritten."""
        with self._lock:
            rel = self._open(rel_path, 0o222, 0o022)
            pol = _POLICY.match(rel)
            dev = _DEVFREQ.match(rel)
            online = _CPU_ONLINE.match(rel)
            if pol:
                self._check_active(pol.group(0), rel_path)
                self._cpufreq_store(pol.group(0), rel[pol.end() + 1:], value, rel_path)
            elif dev and self.exists(dev.group(0) + "/governor"):
                self._devfreq_store(dev.group(0), rel[dev.end() + 1:], value, rel_path)
            elif online:
                self._online_store(int(online.group(1)), value, rel_path)
            else:
                self._put(rel, value.rstrip("\n"))
            log.debug("fake sysfs write %s = %r", rel, value)

    def exists(self, rel_path: str) -> bool:
        """True if the file or directory is there (through symlinks)."""
        return (self.root / rel_path).exists()

    def listdir(self, rel_path: str) -> List[str]:
        """Sorted entry names; empty when ``rel_path`` is not a directory."""
        path = self.root / rel_path
        return sorted(os.listdir(str(path))) if path.is_dir() else []

    # -- files -----------------------------------------------------------------------------------

    def _locate(self, rel_path: str) -> Tuple[str, Path]:
        """The path with symlinks resolved, relative to the root (as the kernel's kobject)."""
        root = os.path.realpath(str(self.root))
        real = os.path.realpath(os.path.join(root, rel_path))
        rel = os.path.relpath(real, root).replace(os.sep, "/")
        if rel == ".." or rel.startswith("../"):
            raise sysfs_error(errno.ENOENT, rel_path, "outside the sysfs root")
        return rel, Path(real)

    def _open(self, rel_path: str, any_bits: int, user_bits: int) -> str:
        """open(2)'s checks. kernfs refuses an access the attribute's mode lacks with EACCES even
        for root (fs/kernfs/file.c kernfs_fop_open); an unprivileged caller also needs the bits."""
        rel, path = self._locate(rel_path)
        try:
            mode = os.stat(str(path)).st_mode
        except OSError:
            raise sysfs_error(errno.ENOENT, rel_path) from None
        if path.is_dir():
            raise sysfs_error(errno.EISDIR, rel_path)
        if not mode & any_bits or (not self.as_root and not mode & user_bits):
            raise sysfs_error(errno.EACCES, rel_path, "mode %o" % (mode & 0o777))
        return rel

    def _get(self, rel: str) -> str:
        text = (self.root / rel).read_bytes().decode("utf-8", "surrogateescape")
        return text[:-1] if text.endswith("\n") else text

    def _int(self, rel: str) -> int:
        return int(self._get(rel).strip() or 0)

    def _put(self, rel: str, text: str) -> None:
        """Rewrite a file as the kernel's show() would print it, whatever its mode."""
        path = self.root / rel
        data = (text + "\n").encode("utf-8", "surrogateescape")
        try:
            path.write_bytes(data)
        except PermissionError:  # a 0444 file when the tests do not run as root
            mode = path.stat().st_mode
            os.chmod(str(path), mode | 0o200)
            try:
                path.write_bytes(data)
            finally:
                os.chmod(str(path), mode)

    def _request(self, where: str, key: str, rel: str, fallback: int) -> int:
        """A request the kernel kept aside, if the file still shows what was written with it."""
        entry = self._requests.get((where, key))
        if entry is not None and self._get(rel).strip() == str(entry[1]):
            return entry[0]
        return fallback

    # -- cpufreq ---------------------------------------------------------------------------------

    def _online(self, cpu: int) -> bool:
        rel = _CPU + "cpu%d/online" % cpu
        return not self.exists(rel) or self._get(rel).strip() != "0"

    def _related(self, pol: str) -> List[int]:
        return [int(c) for c in self._get(pol + "/related_cpus").split()]

    def _check_active(self, pol: str, rel_path: str) -> None:
        """Every show()/store() of a policy whose CPUs are all offline is EBUSY."""
        related = self._related(pol)
        if related and not any(self._online(c) for c in related):
            raise sysfs_error(errno.EBUSY, rel_path, "policy inactive: all its CPUs are offline")

    def _table(self, pol: str) -> Optional[List[int]]:
        rel = pol + "/scaling_available_frequencies"
        return [int(f) for f in self._get(rel).split()] if self.exists(rel) else None

    def _cpu_cur(self, pol: str) -> int:
        """policy->cur as the governor and the limits leave it."""
        table = self._table(pol)
        low, high = self._int(pol + "/scaling_min_freq"), self._int(pol + "/scaling_max_freq")
        governor = self._get(pol + "/scaling_governor").strip()
        cur = self._int(pol + "/scaling_cur_freq")
        if governor == "userspace":
            want = self._requests.get((pol, "setspeed"), (cur, 0))[0]
            if high < want:  # cpufreq_userspace_policy_limits
                return pick_cpufreq(table, high, low, high, True)
            return pick_cpufreq(table, max(want, low), low, high, False)
        if table is None:  # setpolicy (intel_pstate): the names are policies, the CPU picks
            return high if governor == "performance" else clamp(cur, low, high)
        if governor == "performance":
            return pick_cpufreq(table, high, low, high, True)
        if governor == "powersave":
            return pick_cpufreq(table, low, low, high, False)
        if low <= cur <= high:
            return cur
        if cur < low and any(low <= f <= high for f in table):
            return pick_cpufreq(table, low, low, high, False)
        # stable even when no entry fits the limits
        return pick_cpufreq(table, high, low, high, True)

    def _cpufreq_show(self, pol: str, attr: str) -> Optional[str]:
        if attr in ("scaling_cur_freq", "cpuinfo_cur_freq"):
            return str(self._cpu_cur(pol))
        if attr == "scaling_setspeed":  # show_scaling_setspeed / show_speed
            if self._get(pol + "/scaling_governor").strip() != "userspace":
                return "<unsupported>"
            return str(self._cpu_cur(pol))
        if attr == "affected_cpus":
            return " ".join(str(c) for c in self._related(pol) if self._online(c))
        return None

    def _cpufreq_store(self, pol: str, attr: str, value: str, rel_path: str) -> None:
        governor = self._get(pol + "/scaling_governor").strip()
        if attr == "scaling_governor":
            name = parse_token(value, rel_path)
            if name not in self._get(pol + "/scaling_available_governors").split():
                raise sysfs_error(errno.EINVAL, rel_path, "governor %r not offered" % name)
            if name != governor:
                cur = self._cpu_cur(pol)
                self._requests.pop((pol, "setspeed"), None)
                if name == "userspace":  # policy_start: *setspeed = policy->cur
                    self._requests[(pol, "setspeed")] = (cur, 0)
                self._put(pol + "/scaling_governor", name)
        elif attr == "scaling_setspeed":
            if governor != "userspace":  # no ->store_setspeed outside userspace
                raise sysfs_error(errno.EINVAL, rel_path,
                                  "governor is %s, not userspace" % governor)
            self._requests[(pol, "setspeed")] = (parse_uint(value, rel_path), 0)
        elif attr in ("scaling_min_freq", "scaling_max_freq"):
            self._cpufreq_limit(pol, attr == "scaling_min_freq", parse_uint(value, rel_path),
                                rel_path)
        elif attr == "stats/reset":
            lines = self._get(pol + "/stats/time_in_state").splitlines()
            self._put(pol + "/stats/time_in_state",
                      "\n".join(line.split()[0] + " 0" for line in lines if line.split()))
            self._put(pol + "/stats/total_trans", "0")
        else:
            self._put(pol + "/" + attr, value.rstrip("\n"))
            return
        self._cpufreq_settle(pol)

    def _cpufreq_limit(self, pol: str, is_min: bool, value: int, rel_path: str) -> None:
        """scaling_min_freq / scaling_max_freq stores."""
        hw_low, hw_high = self._int(pol + "/cpuinfo_min_freq"), self._int(pol + "/cpuinfo_max_freq")
        low, high = self._int(pol + "/scaling_min_freq"), self._int(pol + "/scaling_max_freq")
        attr = pol + ("/scaling_min_freq" if is_min else "/scaling_max_freq")
        if self.legacy_limits:
            # 4.9 cpufreq_set_policy(): the store copies the policy, changes one field and refuses
            # min > max before verify() clamps into the cpuinfo range (the 4.9 kernel's code).
            if (is_min and value > high) or (not is_min and value < low):
                raise sysfs_error(errno.EINVAL, rel_path, "min %d > max %d" % (
                    value if is_min else low, high if is_min else value))
            self._put(attr, str(clamp(value, hw_low, hw_high)))
            return
        # freq-QoS: both requests stay; verify() clamps into cpuinfo and then min to max.
        want_min = value if is_min else self._request(pol, "min", pol + "/scaling_min_freq", low)
        new_high = clamp(high if is_min else value, hw_low, hw_high)
        new_low = min(clamp(want_min, hw_low, hw_high), new_high)
        self._put(pol + "/scaling_max_freq", str(new_high))
        self._put(pol + "/scaling_min_freq", str(new_low))
        self._requests[(pol, "min")] = (want_min, new_low)

    def _cpufreq_settle(self, pol: str) -> None:
        """Rewrite what the governor's reaction changes, for plain readers of the tree."""
        cur = self._cpu_cur(pol)
        userspace = self._get(pol + "/scaling_governor").strip() == "userspace"
        if not userspace:
            self._requests.pop((pol, "setspeed"), None)
        self._put(pol + "/scaling_cur_freq", str(cur))
        if self.exists(pol + "/cpuinfo_cur_freq"):
            self._put(pol + "/cpuinfo_cur_freq", str(cur))
        self._put(pol + "/scaling_setspeed", str(cur) if userspace else "<unsupported>")

    def _online_store(self, cpu: int, value: str, rel_path: str) -> None:
        """CPU hotplug: ``affected_cpus`` and ``devices/system/cpu/online`` follow."""
        text = value.strip()
        if text not in ("0", "1"):
            raise sysfs_error(errno.EINVAL, rel_path, "expected 0 or 1")
        self._put(_CPU + "cpu%d/online" % cpu, text)
        cpus = sorted(int(m.group(1)) for m in (re.match(r"^cpu(\d+)$", n)
                                                for n in self.listdir(_CPU)) if m)
        self._put(_CPU + "online", cpu_ranges(c for c in cpus if self._online(c)))
        for name in self.listdir(_CPU + "cpufreq"):
            pol = _CPU + "cpufreq/" + name
            if name.startswith("policy") and cpu in self._related(pol):
                self._put(pol + "/affected_cpus", self._cpufreq_show(pol, "affected_cpus") or "")

    # -- devfreq ---------------------------------------------------------------------------------

    def _devfreq_cur(self, dev: str) -> int:
        """update_devfreq(): the governor's target, clamped into the limits, mapped to an OPP."""
        table = sorted(int(f) for f in self._get(dev + "/available_frequencies").split())
        low, high = self._int(dev + "/min_freq"), self._int(dev + "/max_freq")
        if self.legacy_limits:
            high = high or _NO_LIMIT  # 4.9: a limit of 0 is no limit
        governor = self._get(dev + "/governor").strip()
        want, floor = self._int(dev + "/cur_freq"), False
        if governor == "performance":
            want, floor = high, True
        elif governor == "powersave":
            want = low
        elif governor == "userspace" and UINT.match(self._get(dev + "/userspace/set_freq")):
            want = self._int(dev + "/userspace/set_freq")
        elif low <= want <= high:
            return want  # a dynamic governor (nvhost_podgov...) stays where it is within limits
        elif not any(low <= f <= high for f in table):
            return pick_opp(table, high, True)  # no OPP fits: settle on one, do not oscillate
        if want < low:
            want, floor = low, False
        if want > high:
            want, floor = high, True
        return pick_opp(table, want, floor)

    def _devfreq_store(self, dev: str, attr: str, value: str, rel_path: str) -> None:
        if attr == "governor":
            name = parse_token(value, rel_path)
            if name not in self._get(dev + "/available_governors").split():
                # 4.9 governor_store(): find_devfreq_governor() is -ENODEV; 5.x
                # try_then_request_governor() turns the failed request_module() into -EINVAL.
                code = errno.ENODEV if self.legacy_limits else errno.EINVAL
                raise sysfs_error(code, rel_path, "governor %r not available" % name)
            if name != self._get(dev + "/governor").strip():
                cur = self._devfreq_cur(dev)
                self._put(dev + "/cur_freq", str(cur))
                userspace = self.root / dev / "userspace"
                shutil.rmtree(str(userspace), ignore_errors=True)  # GOV_STOP removes the group
                if name == "userspace":  # GOV_START creates it; "undefined" until written
                    userspace.mkdir()
                    self._put(dev + "/userspace/set_freq", "undefined")
                    os.chmod(str(userspace / "set_freq"), 0o644)
                self._put(dev + "/governor", name)
        elif attr in ("min_freq", "max_freq"):
            self._devfreq_limit(dev, attr == "min_freq", parse_uint(value, rel_path), rel_path)
        elif attr in ("userspace/set_freq", "polling_interval"):
            # set_freq shows the request
            self._put(dev + "/" + attr, str(parse_uint(value, rel_path)))
        else:
            self._put(dev + "/" + attr, value.rstrip("\n"))
            return
        cur = self._devfreq_cur(dev)
        self._put(dev + "/cur_freq", str(cur))
        if self.exists(dev + "/target_freq"):
            self._put(dev + "/target_freq", str(cur))

    def _devfreq_limit(self, dev: str, is_min: bool, value: int, rel_path: str) -> None:
        """devfreq min_freq / max_freq stores."""
        low, high = self._int(dev + "/min_freq"), self._int(dev + "/max_freq")
        if self.legacy_limits:
            # 4.9 min_freq_store/max_freq_store: EINVAL only when both limits are set and the new
            # one crosses the other; the value is stored as written, 0 meaning none.
            other = high if is_min else low
            if value and other and (value > other if is_min else value < other):
                raise sysfs_error(errno.EINVAL, rel_path, "crosses the other limit %d" % other)
            self._put(dev + ("/min_freq" if is_min else "/max_freq"), str(value))
            return
        # QoS: min rounds down and max up to kHz, 0 is no limit; reads show get_freq_range(),
        # the OPP range narrowed by the requests, min lowered to max.
        table = sorted(int(f) for f in self._get(dev + "/available_frequencies").split())
        if is_min:
            want_min, want_max = value // 1000 * 1000, high
        else:
            want_min = self._request(dev, "min", dev + "/min_freq", low)
            want_max = -(-value // 1000) * 1000 if value else 0
        new_high = min(table[-1], want_max) if want_max else table[-1]
        new_low = min(max(table[0], want_min), new_high)
        self._put(dev + "/max_freq", str(new_high))
        self._put(dev + "/min_freq", str(new_low))
        self._requests[(dev, "min")] = (want_min, new_low)
