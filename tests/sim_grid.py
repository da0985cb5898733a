"""The smoke grid that the tests of ``--jobs``, ``--workers`` and ``--executor ray`` run both ways,
and the look at processes (Linux /proc) with which they check that no worker is left behind.

The grid is the smoke scenario's two methods on two seeds, 30 virtual seconds each. Figures must
match but for ``wall_s`` (this machine's seconds), and ``metrics.jsonl`` line for line but for
``update_id``, which each device draws with ``uuid4`` (random in a serial run too).
"""
import json
import re
from pathlib import Path

from streamfl.cli import main
from streamfl.sim.driver import Progress
from streamfl.sim.scenario import load_scenario

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "scenarios" / "smoke.yaml"
GRID = ["--seeds", "2", "--duration", "30", "--methods", "fedasync,fedavg"]
UPDATE_ID = re.compile(r'"update_id":"[0-9a-f]+"')


def quiet() -> Progress:
    """A progress bar that prints nowhere."""
    return Progress(4, stream=open("/dev/null", "w"))


def run_files(run_dir: Path):
    """What must not depend on where the runs ran: metrics lines, figures, the scenario as run."""
    lines = [UPDATE_ID.sub('"update_id":"-"', line)
             for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    for method in summary["methods"].values():
        for figures in method["runs"]:
            assert figures.pop("wall_s") >= 0
    return lines, summary, (run_dir / "scenario.yaml").read_text()


def serial_files(tmp_path_factory):
    """The serial run of the grid, through the command as a user runs it: its ``run_files``."""
    out = tmp_path_factory.mktemp("serial") / "run"
    assert main(["sim", str(SMOKE), *GRID, "--out", str(out)]) == 0
    lines, summary, scenario = run_files(out)
    assert len(lines) > 100 and summary["seeds"] == [0, 1]
    assert [r["seed"] for r in summary["methods"]["fedavg"]["runs"]] == [0, 1]
    return lines, summary, scenario


def smoke():
    """The scenario the command runs for ``GRID``."""
    return load_scenario(SMOKE, {"duration_s": 30.0})


def alive(pid):
    """True while ``pid`` runs (a zombie waiting for a reaper has ended)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return False


def child_pids(pid):
    """The pids whose parent is ``pid``."""
    import os
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return found
