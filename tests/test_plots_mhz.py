"""Clock plots show MHz: the levels updates carry are converted through each device's board
profile (the demo's plot and the simulator report's), the axis says MHz, and where a device's
profile is unknown the axis shows levels and says so."""
import json
from pathlib import Path

import numpy as np
import pytest

from streamfl.cli import main
from streamfl.dvfs.profiles import load_profile
from streamfl.sim import plots
from streamfl.sim.plots import level_mhz, plot_clock_levels, plot_clock_levels_by_method
from streamfl.sim.report_html import boards_by_method_seed, render_report

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
ORIN_GPU = load_profile("jetson-orin-nano").domain("gpu").levels_khz
PI4_CPU = load_profile("raspberry-pi-4").domain("cpu0").levels_khz


@pytest.fixture
def drawn(monkeypatch):
    """Every figure the plots save: (its axes' y labels, each axis's lines' y data)."""
    seen = []
    save = plots.save_figure

    def keep(fig, path):
        seen.append([(ax.get_ylabel(), [list(line.get_ydata()) for line in ax.get_lines()])
                     for ax in fig.axes])
        return save(fig, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    return seen


def _updates(boards_levels):
    """Update events: device -> (domain, levels over time)."""
    out = []
    for n, (device, (domain, levels)) in enumerate(sorted(boards_levels.items())):
        for step, level in enumerate(levels):
            out.append({"event": "update", "device": device, "time_s": step + 0.1 * n,
                        "wall_s": 100.0 + step, "clock_levels": {domain: level}})
    return out


def test_a_level_is_its_profiles_frequency_and_unknowns_are_none():
    assert level_mhz("jetson-orin-nano", "gpu", 0) == ORIN_GPU[0] / 1000.0
    assert level_mhz("raspberry-pi-4", "cpu0", 9) == PI4_CPU[9] / 1000.0 == 1500.0
    assert level_mhz("raspberry-pi-4", "cpu0", 10) is None          # past the ladder
    assert level_mhz("raspberry-pi-4", "gpu", 0) is None            # no such domain
    assert level_mhz("generic-linux", "cpu0", 0) is None            # domains found at start only
    assert level_mhz("my-own-board", "gpu", 0) is None
    assert level_mhz(None, "gpu", 0) is None
    assert level_mhz("raspberry-pi-4", "cpu0", 1.5) is None


def test_the_demo_plot_is_in_mhz_through_each_devices_board(tmp_path, drawn):
    updates = _updates({"a": ("gpu", [0, 2, 4]), "b": ("cpu0", [0, 5, 9])})
    assert plot_clock_levels(updates, tmp_path / "clocks.png",
                             boards={"a": "jetson-orin-nano", "b": "raspberry-pi-4"}) is not None
    (label, lines), = drawn[-1]
    assert label == "clock (MHz)"
    assert np.allclose(lines[0], [ORIN_GPU[i] / 1e3 for i in (0, 2, 4)])
    assert np.allclose(lines[1], [600.0, 1100.0, 1500.0])


def test_the_boards_come_from_the_coordinators_device_events_too(tmp_path, drawn):
    metrics = [{"event": "device", "device": "a", "online": True, "board": "raspberry-pi-4"}]
    metrics += _updates({"a": ("cpu0", [1, 3])})
    plot_clock_levels(metrics, tmp_path / "clocks.png")
    (label, lines), = drawn[-1]
    assert label == "clock (MHz)" and np.allclose(lines[0], [700.0, 900.0])


def test_one_unknown_board_puts_the_whole_axis_in_levels(tmp_path, drawn):
    updates = _updates({"a": ("gpu", [0, 2]), "b": ("cpu0", [1, 3])})
    plot_clock_levels(updates, tmp_path / "clocks.png", boards={"a": "jetson-orin-nano"})
    (label, lines), = drawn[-1]
    assert label == "clock level (0 = lowest)"
    assert lines == [[0, 2], [1, 3]]


def test_the_report_panels_are_in_mhz_where_the_summary_names_each_board(tmp_path, drawn):
    updates = {"m": {1: [dict(u, method="m", seed=1) for u in
                         _updates({"dev-0": ("gpu", [0, 1]), "dev-1": ("cpu0", [2, 9])})]},
               "n": {1: [dict(u, method="n", seed=1) for u in _updates({"dev-0": ("gpu", [3])})]}}
    boards = {"m": {1: {"dev-0": "jetson-orin-nano", "dev-1": "raspberry-pi-4"}}}
    assert plot_clock_levels_by_method(updates, ["m", "n"], tmp_path / "c.png", [1], boards)
    (m_label, m_lines), (n_label, n_lines) = drawn[-1]
    assert m_label == "clock (MHz)" and np.allclose(m_lines[1], [800.0, 1500.0])
    assert n_label == "clock level (0 = lowest)" and n_lines == [[3]]   # method n: no boards known


def test_boards_by_method_and_seed_from_a_simulator_summary():
    summary = json.loads((ROOT / "tests" / "golden" / "smoke.json").read_text())
    boards = boards_by_method_seed(summary)
    for method, entry in summary["methods"].items():
        for run in entry["runs"]:
            assert boards[method][run["seed"]] == {dev: d["board"] for dev, d in run["devices"].items()}
    assert boards_by_method_seed({"methods": {"x": {"runs": [{"seed": "1"}]}}}) == {}


def test_a_simulator_run_reports_its_clocks_in_mhz(tmp_path, drawn):
    """``streamfl sim`` then ``streamfl report``: the report's clock panels are in MHz, and the
    page's caption says so."""
    out = tmp_path / "run"
    assert main(["sim", str(ROOT / "configs" / "scenarios" / "smoke.yaml"), "--seeds", "1",
                 "--duration", "20", "--methods", "fedasync", "--out", str(out)]) == 0
    drawn.clear()
    render_report(out)
    clock_panels = [axes for axes in drawn if any("clock" in label for label, _ in axes)]
    assert clock_panels, drawn
    labels = [label for label, _ in clock_panels[0]]
    assert labels and set(labels) == {"clock (MHz)"}, labels
    assert "in MHz" in (out / "report.html").read_text()
