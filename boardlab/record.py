"""The lab's JSON record per target, what makes a target fail, and the table docs/deployment.md shows."""
from typing import Any, Dict, List, Optional, Sequence

#: The record's keys in the order they print, then the rest.
ORDER = ("target", "ok", "failures", "emulation", "qemu_cpu", "python", "torch", "numpy", "streamfl",
         "install_s", "import_s", "agent_rss_mib", "train_s_per_round", "s_between_rounds",
         "rounds", "aggregated", "clocks_restored", "unit_verified")


#: qemu cores without the ARMv8.1 atomics (HWCAP_ATOMICS): a probe that finds them there ran on
#: another core than the target names.
CORES_WITHOUT_ATOMICS = ("cortex-a35", "cortex-a53", "cortex-a57", "cortex-a72")


def failures(rec: Dict[str, Any], rounds_wanted: int, python_wanted: Optional[str] = None) -> List[str]:
    """Why a target's record is not a pass (empty: it is)."""
    out = list(rec.get("failures") or [])
    if rec.get("blocked"):
        out.append("blocked: %s" % rec["blocked"])
        return out
    net = rec.get("network") or {}
    if not net.get("cut"):
        out.append("the install's namespace was not cut off (%s)" % net)
    if rec.get("install_exit") != 0:
        out.append("the install script exited %s" % rec.get("install_exit"))
    if rec.get("import_error"):
        out.append("import streamfl.agent failed in the root")
    if rec.get("qemu_cpu") in CORES_WITHOUT_ATOMICS and rec.get("cpu_atomics") is True:
        out.append("the probe's core has the ARMv8.1 atomics: qemu did not emulate %s" % rec["qemu_cpu"])
    if python_wanted and rec.get("python") and not str(rec["python"]).startswith(python_wanted + "."):
        out.append("the root's Python is %s, not %s" % (rec["python"], python_wanted))
    if (rec.get("aggregated") or 0) < rounds_wanted:
        out.append("%s of %d rounds aggregated" % (rec.get("aggregated") or 0, rounds_wanted))
    if rec.get("clocks_restored") is not True:
        out.append("clocks not restored: %s" % (rec.get("clocks_not_restored") or "not checked"))
    if rec.get("clocks_changed_while_running") is False:
        out.append("the agent never changed a clock (the restore proves nothing)")
    if rec.get("agent_exit") not in (0, None) and "agent_exit" in rec:
        out.append("the agent exited %s on SIGTERM" % rec.get("agent_exit"))
    if rec.get("unit_enabled") is False:
        out.append("the install did not enable the unit")
    if rec.get("unit_verified") is not True:
        out.append("the unit did not pass systemd-analyze verify: %s" % (rec.get("unit_verify_said") or rec.get("unit_verify_exit")))
    return out


def finish(rec: Dict[str, Any], rounds_wanted: int, python_wanted: Optional[str] = None) -> Dict[str, Any]:
    """``rec`` with ``ok`` and ``failures`` set and its keys in ``ORDER``."""
    fails = failures(rec, rounds_wanted, python_wanted)
    rec = dict(rec, ok=not fails, failures=fails)
    ordered = {k: rec[k] for k in ORDER if k in rec}
    ordered.update((k, v) for k, v in rec.items() if k not in ordered)
    return ordered


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return str(value)


COLUMNS = (("target", "target"), ("emulation", "emulation"), ("qemu_cpu", "core"),
           ("python", "Python"), ("torch", "torch"),
           ("numpy", "numpy"), ("install_s", "install s"), ("import_s", "import s"),
           ("agent_rss_mib", "RSS MiB"), ("train_s_per_round", "train s/round"),
           ("s_between_rounds", "s between rounds"), ("aggregated", "rounds"),
           ("clocks_restored", "clocks restored"), ("unit_verified", "unit verified"), ("ok", "ok"))


def table(records: Sequence[Dict[str, Any]]) -> str:
    """A markdown table of the records, one row per target."""
    lines = ["| %s |" % " | ".join(h for _, h in COLUMNS), "|%s|" % "|".join("---" for _ in COLUMNS)]
    for rec in records:
        row = []
        for key, _ in COLUMNS:
            value = rec.get(key)
            if key == "emulation" and isinstance(value, str):
                value = value.split(" (")[0]
            row.append(_cell(value))
        lines.append("| %s |" % " | ".join(row))
    return "\n".join(lines)
