"""The capacity model: where each part of a fleet saturates, computed from costs measured here.

Inputs are the JSON that ``bench/load.py`` prints, one run per model size: a real coordinator
process and a real mosquitto under lightweight agents. Each run gives the coordinator process's
CPU per update at that size (all its threads: MQTT receive, decode, admission, aggregation,
metrics, durable publishing; one Python process, so about one core at most), the broker's CPU per
MB it moves, its memory with the agents connected, and the models a board receives per round.
``bench/bench_coordinator.py`` measures the coordinator's core alone (decode, admission,
aggregation, snapshot), far cheaper than the whole process: it is the floor, not the model. From
the runs, for a fleet of ``boards`` that each start a round every ``round_period_s`` (FedAsync: one
update per round):

- updates/s ``U = boards / round_period_s``;
- the coordinator process (one core at most): ``U`` times its measured CPU per update;
- bytes through the broker: updates in from the boards and out to the coordinator, models out to
  the boards (``models_per_round`` each round), plus each published version once in;
- the broker's CPU (mosquitto runs one thread): MB moved per second times its measured CPU per MB;
- the broker's link: MB/s against a 1 Gbit/s port;
- each board's cellular bytes per hour: ``3600 / round_period_s`` times one update and one model;
- the broker's memory: its measured MB per connected board times ``boards``.

A part is *saturated* above ``HEADROOM`` of what it has (70%: queues grow without bound as a
single-threaded server nears 100%, and the machine runs other things). For each cell the first part
to saturate names the next step of the ladder in docs/capacity.md.

    python bench/load.py --agents 300 > load.json
    python bench/load.py --agents 100 --in-channels 900 > load-2mb.json
    python bench/capacity.py --load load.json --load load-2mb.json [--markdown]
"""
import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

#: Share of a resource a part may use before it counts as saturated.
HEADROOM = 0.7
#: One broker port: 1 Gbit/s in MB/s.
LINK_MB_PER_S = 125.0
#: The fleets and paces the table covers.
FLEETS = (1000, 10000, 100000)
ROUND_PERIODS_S = (10.0, 60.0, 600.0)
#: Bytes saved by ``update_encoding: int8_delta`` with ``model_encoding: int8`` on the default
#: model, measured in the simulator (docs/results/compression.md); the steps apply it to bytes only.
INT8_BYTES_FACTOR = 3.2

#: The ladder, in the order a growing fleet climbs it (docs/capacity.md says how).
STEPS = {
    "ok": "nothing: one coordinator, one broker",
    "board_link": "compression (update_encoding int8_delta, model_encoding int8) or a longer round period",
    "broker_link": "compression, then site brokers bridged to a root (each site carries its boards' models)",
    "broker_cpu": "compression, then site brokers bridged to a root, then a clustered broker",
    "broker_memory": "site brokers bridged to a root, or a clustered broker",
    "coordinator": "several coordinators by fleet (one fleet per site or group), or a longer round period",
}


def cell(boards: int, round_period_s: float, model: Dict[str, Any], broker: Dict[str, Any],
         models_per_round: float, board_mb_per_hour_budget: float) -> Dict[str, Any]:
    """One fleet size at one pace: the load on each part and the first to saturate."""
    rate = boards / round_period_s
    update_b, model_b = model["frame_bytes"], model["frame_bytes"]
    moved_mb_s = rate * (2 * update_b + models_per_round * model_b) / 1e6
    load = {
        "coordinator": rate * model["cpu_ms_per_update"] / 1e3,
        "broker_cpu": moved_mb_s * broker["cpu_ms_per_mb_moved"] / 1e3,
        "broker_link": moved_mb_s / LINK_MB_PER_S,
        "broker_memory": boards * broker["mb_per_board"] / broker["memory_budget_mb"],
        "board_link": (3600.0 / round_period_s) * (update_b + model_b) / 1e6 / board_mb_per_hour_budget,
    }
    over = sorted((v, k) for k, v in load.items() if v > HEADROOM)
    first = over[-1][1] if over else "ok"
    return {"boards": boards, "round_period_s": round_period_s, "model": model["model"],
            "updates_per_s": round(rate, 1), "broker_mb_per_s": round(moved_mb_s, 1),
            "board_mb_per_hour": round((3600.0 / round_period_s) * (update_b + model_b) / 1e6, 1),
            "load": load if boards == 1 else {k: round(v, 3) for k, v in load.items()},
            "first_saturated": first, "next_step": STEPS[first]}


def broker_costs(load_reports: List[Dict[str, Any]], memory_budget_mb: float) -> Dict[str, Any]:
    """The broker's CPU per MB moved (the dearest run's) and memory per connected board (the run
    with the most agents: with few, the broker's own baseline dominates), from bench/load.py."""
    runs = [r for r in load_reports if "cpu_ms_per_mb_moved" in (r.get("broker") or {})]
    if not runs:
        raise SystemExit("capacity.py: no load report has the broker's CPU (only --chaos runs?)")
    biggest = max(runs, key=lambda r: r["run"]["agents"])
    agents = biggest["run"]["agents"]
    return {"cpu_ms_per_mb_moved": max(float(r["broker"]["cpu_ms_per_mb_moved"]) for r in runs),
            "mb_per_board": max(biggest["broker"].get("rss_mb") or 0.0, 0.0) / agents,
            "memory_budget_mb": memory_budget_mb, "measured_with_agents": agents}


def model_costs(load_reports: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per model size: the frame's bytes and the coordinator process's CPU per update, the dearest
    run of that size (a small run's fixed costs per second count against its few updates)."""
    by_model: Dict[str, Dict[str, Any]] = {}
    for r in load_reports:
        sent, window_s = r["sent"], r["run"]["send_window_s"]
        share = r["coordinator"].get("cpu_share")
        if not sent or share is None:
            continue
        cost = {"model": r["run"]["model"], "frame_bytes": int(r["downlink"]["bytes_per_board_per_round"]),
                "cpu_ms_per_update": 1e3 * share * window_s / sent, "agents": r["run"]["agents"]}
        old = by_model.get(cost["model"])
        if old is None or cost["agents"] > old["agents"]:
            by_model[cost["model"]] = cost
    return sorted(by_model.values(), key=lambda c: c["frame_bytes"])


def table(models: List[Dict[str, Any]], broker: Dict[str, Any], models_per_round: float,
          board_mb_per_hour_budget: float, compressed: bool) -> List[Dict[str, Any]]:
    rows = []
    for model in models:
        if compressed:  # fewer bytes on the wire; the coordinator's cost per update is unchanged
            model = dict(model, model=model["model"] + " int8",
                         frame_bytes=int(model["frame_bytes"] / INT8_BYTES_FACTOR))
        for boards in FLEETS:
            for period in ROUND_PERIODS_S:
                rows.append(cell(boards, period, model, broker, models_per_round,
                                 board_mb_per_hour_budget))
    return rows


def limits(models: List[Dict[str, Any]], broker: Dict[str, Any], models_per_round: float,
           compressed: bool) -> List[Dict[str, Any]]:
    """Per model and pace: the largest fleet each shared part serves within ``HEADROOM`` (loads grow
    in proportion to the boards), and which part limits the fleet first."""
    out = []
    for model in models:
        if compressed:
            model = dict(model, model=model["model"] + " int8",
                         frame_bytes=int(model["frame_bytes"] / INT8_BYTES_FACTOR))
        for period in ROUND_PERIODS_S:
            one = cell(1, period, model, broker, models_per_round, float("inf"))["load"]
            most = {part: int(round(HEADROOM / one[part], 6)) for part in
                    ("coordinator", "broker_cpu", "broker_link", "broker_memory") if one[part] > 0}
            first = min(most, key=most.get)
            out.append({"model": model["model"], "round_period_s": period, "max_boards": most,
                        "limited_by": first, "next_step": STEPS[first]})
    return out


def markdown(rows: List[Dict[str, Any]]) -> str:
    """The table as docs/capacity.md shows it."""
    out = ["| model | boards | round every | updates/s | broker MB/s | board MB/h | coordinator | "
           "broker CPU | broker link | first to saturate |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        load = r["load"]
        out.append("| %s | %d | %g s | %g | %g | %g | %.0f%% | %.0f%% | %.0f%% | %s |" % (
            r["model"], r["boards"], r["round_period_s"], r["updates_per_s"], r["broker_mb_per_s"],
            r["board_mb_per_hour"], 100 * load["coordinator"], 100 * load["broker_cpu"],
            100 * load["broker_link"], r["first_saturated"]))
    return "\n".join(out)


def markdown_limits(rows: List[Dict[str, Any]]) -> str:
    """The largest fleet per part, as docs/capacity.md shows it."""
    out = ["| model | round every | coordinator | broker CPU | broker link (1 Gbit/s) | limited by |",
           "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        most = r["max_boards"]
        out.append("| %s | %g s | %s | %s | %s | %s |" % (
            r["model"], r["round_period_s"], "{:,}".format(most["coordinator"]),
            "{:,}".format(most["broker_cpu"]), "{:,}".format(most["broker_link"]), r["limited_by"]))
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--load", type=Path, action="append", required=True,
                   help="bench/load.py's JSON (not --chaos); once per model size")
    p.add_argument("--broker-memory-mb", type=float, default=4096.0,
                   help="memory the broker may use (a 4 GB machine by default)")
    p.add_argument("--board-mb-per-hour", type=float, default=100.0,
                   help="what a board's link may carry per hour (a cellular plan's share)")
    p.add_argument("--compressed", action="store_true", help="with int8 updates and models")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = p.parse_args(argv)
    reports = [json.loads(path.read_text()) for path in args.load]
    broker = broker_costs(reports, args.broker_memory_mb)
    models_per_round = max(float(r["downlink"]["models_per_round_started"] or 1.0) for r in reports)
    models = model_costs(reports)
    rows = table(models, broker, models_per_round, args.board_mb_per_hour, args.compressed)
    most = limits(models, broker, models_per_round, args.compressed)
    if args.markdown:
        print(markdown(rows))
        print()
        print(markdown_limits(most))
    else:
        print(json.dumps({"benchmark": "capacity_model", "headroom": HEADROOM, "broker": broker,
                          "models": models, "models_per_round": models_per_round, "rows": rows,
                          "max_boards": most},
                         indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
