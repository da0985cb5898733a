"""bench/capacity.py: the loads follow from the measured costs, and each part's limit is where its
load reaches the headroom."""
import json

import pytest

from bench_scripts import load_bench


def _module():
    return load_bench("capacity")


def load_report(agents=1000, sent=24000, window_s=240.0, cpu_share=0.4, frame=280000,
                broker_cpu=1.0, rss_mb=12.0, models_per_round=1.0, model="lstm"):
    """The parts of a bench/load.py report that capacity.py reads."""
    return {"sent": sent, "run": {"agents": agents, "send_window_s": window_s, "model": model},
            "coordinator": {"cpu_share": cpu_share},
            "broker": {"cpu_ms_per_mb_moved": broker_cpu, "rss_mb": rss_mb},
            "downlink": {"models_per_round_started": models_per_round,
                         "bytes_per_board_per_round": frame}}


def test_loads_follow_the_measured_costs_and_limits_meet_the_headroom(tmp_path):
    cap = _module()
    report = load_report()
    models = cap.model_costs([report])
    assert models[0]["cpu_ms_per_update"] == pytest.approx(1e3 * 0.4 * 240.0 / 24000)  # 4 ms
    broker = cap.broker_costs([report], 4096.0)
    one = cap.cell(1000, 10.0, models[0], broker, 1.0, 100.0)
    # 100 updates/s: 0.4 of a core; 3 frames of 280 kB each = 84 MB/s through the broker.
    assert one["updates_per_s"] == 100.0 and one["load"]["coordinator"] == pytest.approx(0.4)
    assert one["broker_mb_per_s"] == pytest.approx(84.0)
    assert one["load"]["broker_cpu"] == pytest.approx(0.084)
    assert one["load"]["broker_link"] == pytest.approx(84.0 / 125.0)
    assert one["board_mb_per_hour"] == pytest.approx(360 * 0.56)
    assert one["first_saturated"] == "board_link"                      # 201.6 MB/h > 70 of 100
    ten = cap.cell(10000, 10.0, models[0], broker, 1.0, 1e9)
    assert ten["load"]["coordinator"] == pytest.approx(4.0)             # linear in the fleet
    assert ten["first_saturated"] == "broker_link"                      # 6.7 > 4.0 > ...
    limits = {r["round_period_s"]: r for r in cap.limits(models, broker, 1.0, False)}
    assert limits[10.0]["max_boards"]["coordinator"] == 1750             # 0.7 / 0.0004
    assert limits[10.0]["max_boards"]["broker_link"] == 1041             # 0.7 * 125 / 0.084
    assert limits[10.0]["limited_by"] == "broker_link"
    # Compression cuts bytes, not the coordinator's cost: the coordinator limits first.
    packed = {r["round_period_s"]: r for r in cap.limits(models, broker, 1.0, True)}
    assert packed[10.0]["max_boards"]["coordinator"] == 1750
    assert packed[10.0]["max_boards"]["broker_link"] > 3 * 1041
    assert packed[10.0]["limited_by"] == "coordinator"


def test_the_dearest_and_largest_runs_are_used_and_a_chaos_run_alone_is_refused(tmp_path):
    cap = _module()
    small = load_report(agents=10, sent=100, window_s=100.0, cpu_share=0.05, broker_cpu=2.0,
                        rss_mb=5.0)
    big = load_report()
    costs = cap.model_costs([small, big])
    assert len(costs) == 1 and costs[0]["agents"] == 1000                # the run with most agents
    broker = cap.broker_costs([small, big], 4096.0)
    assert broker["cpu_ms_per_mb_moved"] == 2.0 and broker["mb_per_board"] == pytest.approx(0.012)
    chaos = load_report()
    del chaos["broker"]["cpu_ms_per_mb_moved"]
    with pytest.raises(SystemExit, match="broker"):
        cap.broker_costs([chaos], 4096.0)
    path = tmp_path / "load.json"
    path.write_text(json.dumps(big))
    assert cap.main(["--load", str(path), "--markdown"]) == 0
