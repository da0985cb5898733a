"""``streamfl sim`` then ``streamfl report`` through the command's own entry point, on a user's .npz
in the documented format (docs/simulation.md), as a user would run them."""
import json
from pathlib import Path

import numpy as np
import yaml

from streamfl.cli import main

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "scenarios" / "smoke.yaml"


def _write_npz(path: Path, n: int = 240, t: int = 16, c: int = 3, k: int = 3) -> Path:
    """X float32 [N, T, C], y int64 [N], subject int64 [N], classes str [K]: a learnable toy set."""
    rng = np.random.default_rng(7)
    y = (np.arange(n) % k).astype(np.int64)
    X = rng.normal(0.0, 0.5, (n, t, c)).astype(np.float32)
    X[np.arange(n), :, y % c] += 1.5
    subject = (np.arange(n) % 6).astype(np.int64)
    np.savez(path, X=X, y=y, subject=subject, classes=np.array(["walk", "run", "sit"][:k]))
    return path


def test_sim_then_report_on_a_user_dataset(tmp_path, capsys):
    data = _write_npz(tmp_path / "mine.npz")
    out = tmp_path / "run"
    rc = main(["sim", str(SMOKE), "--seeds", "1", "--duration", "30", "--methods", "fedasync,fedavg",
               "--dataset", str(data), "--out", str(out), "--set", "eval_every_s=5"])
    assert rc == 0
    assert "run folder: %s" % out in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "npz" and set(summary["methods"]) == {"fedasync", "fedavg"}
    for name, m in summary["methods"].items():
        for key in ("final_accuracy", "final_accuracy_std", "energy_j", "energy_j_std",
                    "time_to_accuracy_s"):
            assert key in m, (name, key)
        assert 0.0 <= m["final_accuracy"] <= 1.0 and m["energy_j"] > 0
        assert set(m["time_to_accuracy_s"]) == {str(t) for t in summary["thresholds"]}
    # The user's whole file, split as the scenario says (smoke subsamples its own data to 1500).
    as_run = yaml.safe_load((out / "scenario.yaml").read_text())
    assert as_run["data"]["path"] == str(data) and as_run["data"]["n_windows"] is None
    assert as_run["data"]["partition"] == "iid" and as_run["eval_every_s"] == 5
    assert main(["report", str(out)]) == 0
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert {"accuracy_vs_time.png", "accuracy_vs_energy.png", "clock_levels.png"} <= set(pngs)
    html = (out / "report.html").read_text()
    assert "fedasync" in html and "fedavg" in html and all(p in html for p in pngs)
    # The Markdown table docs/results.md prints its tables with, from the same summary.
    capsys.readouterr()
    assert main(["report", str(out), "--markdown"]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert table[0].startswith("| method | final accuracy | mean accuracy over the run |")
    assert len(table) == 4 and table[1].startswith("|---|")
    fa, fv = summary["methods"]["fedasync"], summary["methods"]["fedavg"]
    row = {line.split(" | ")[0].strip("| `"): line for line in table[2:]}
    assert row["fedasync"].endswith("| +0.0 | 1.00 |")
    assert "%.3f ± %.3f" % (fv["mean_accuracy"], fv["mean_accuracy_std"]) in row["fedavg"]
    assert row["fedavg"].endswith("| %+.1f | %.2f |" % (100 * (fv["mean_accuracy"] - fa["mean_accuracy"]),
                                                         fv["energy_j"] / fa["energy_j"]))
    # Without the reference method the comparison columns are left out.
    assert main(["report", str(out), "--markdown", "--reference", "adaclp"]) == 0
    assert "vs" not in capsys.readouterr().out


def test_a_bad_set_is_a_configuration_error(tmp_path, capsys):
    rc = main(["sim", str(SMOKE), "--seeds", "1", "--out", str(tmp_path / "never"),
               "--set", "devices.9.speed=2"])
    assert rc != 0 and "devices" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()
