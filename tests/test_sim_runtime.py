"""The simulator's runtime: the same seed gives the same run, methods see the same streams, and
the simulator's coordinator path agrees with a real coordinator over MQTT."""
import json
import threading

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.persistence import StateStore
from streamfl.dvfs.profiles import load_profile
from streamfl.errors import ConfigError
from streamfl.sim.driver import Progress, run_sim
from streamfl.models import tensor_spec
from streamfl.protocol.codec import Decoder
from streamfl.sim.device import DeviceModel, DeviceSpec
from streamfl.sim.replay import ReplayRun, replay_updates
from streamfl.sim.scenario import scenario_from_dict

TINY = {
    "name": "tiny", "duration_s": 60.0,
    "model": {"name": "cnn1d", "hidden": 16},
    "data": {"dataset": "synthetic", "n_windows": 600, "partition": "iid"},
    "stream": {"kind": "extreme", "windows_per_s": 2.0},
    "devices": [{"count": 2, "board": "jetson-orin-nano"},
                {"count": 1, "board": "raspberry-pi-4", "speed": 3.0}],
    "methods": ["fedasync", "fedavg"],
    "eval_every_s": 10.0, "eval_windows": 200,
    "agent": {"min_buffer": 8, "buffer_capacity": 128},
    "coordinator": {"hparams": {"lr": 0.05, "batch_size": 16, "local_steps": 4}},
}


def _run(tmp_path, name, **over):
    values = dict(TINY, **over)
    out = tmp_path / name
    summary = run_sim(scenario_from_dict(values), out, progress=Progress(1, stream=open("/dev/null", "w")))
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return summary, lines


def _train_w(board, levels=None):
    """What the device model bills a round of ``board`` per second at ``levels`` (missing = top)."""
    return DeviceModel(DeviceSpec(board=board), load_profile(board), 0).train_w(levels or {})


def _check_energy(summary, lines):
    """Training and idle energy add up to the total in every eval event, device total and summary,
    and every update was billed the utilization-weighted power of its levels for its time."""
    for e in lines:
        if e["event"] == "eval":
            assert e["train_energy_j"] + e["idle_energy_j"] == pytest.approx(e["energy_j"], abs=2e-3)
    for method in summary["methods"].values():
        for key in ("energy_j", "train_energy_j", "idle_energy_j"):
            assert method[key] is not None and method[key + "_std"] is not None, key
        assert method["train_energy_j"] + method["idle_energy_j"] == pytest.approx(
            method["energy_j"], abs=2e-3)
        boards = {}
        for run in method["runs"]:
            assert run["train_energy_j"] + run["idle_energy_j"] == pytest.approx(
                run["energy_j"], abs=2e-3)
            for dev_id, dev in run["devices"].items():
                boards[dev_id] = dev["board"]
                assert dev["train_energy_j"] + dev["idle_energy_j"] == pytest.approx(
                    dev["energy_j"], abs=2e-3)
                assert dev["train_energy_j"] > 0 and dev["idle_energy_j"] > 0
    for e in lines:
        if e["event"] == "update":
            watts = _train_w(boards[e["device"]], e["clock_levels"])
            assert e["energy_j"] == pytest.approx(watts * e["train_s"], rel=1e-5, abs=1e-5)


def _check_top_level_billing(run):
    """With the clocks left at their top (policy none), every second a device trained, whether
    its round arrived, was lost or diverged, is billed the top levels' power."""
    for dev in run["devices"].values():
        assert dev["train_energy_j"] == pytest.approx(_train_w(dev["board"]) * dev["train_s"],
                                                      abs=0.02)


def test_the_same_seed_gives_identical_metrics(tmp_path):
    s1, m1 = _run(tmp_path, "a")
    s2, m2 = _run(tmp_path, "b")
    for line in m1 + m2:
        line.pop("update_id", None)             # a random name (uuid4), not a figure
    assert m1 == m2 and len(m1) > 20
    for method in ("fedasync", "fedavg"):
        r1, r2 = s1["methods"][method]["runs"][0], s2["methods"][method]["runs"][0]
        r1.pop("wall_s"), r2.pop("wall_s")
        assert r1 == r2
    assert {e["method"] for e in m1} == {"fedasync", "fedavg"}


def test_methods_see_the_same_devices_and_another_seed_differs(tmp_path):
    summary, lines = _run(tmp_path, "a", seeds=2, methods=["fedasync", "fedavg"])
    runs = {(m, r["seed"]): r for m, s in summary["methods"].items() for r in s["runs"]}
    # Device behaviour (stream, clocks, compute time) does not depend on the method...
    assert runs[("fedasync", 0)]["devices"] == runs[("fedavg", 0)]["devices"]
    # ...but does on the seed.
    assert runs[("fedasync", 0)]["devices"] != runs[("fedasync", 1)]["devices"]
    fa = summary["methods"]["fedasync"]
    assert fa["seeds"] == 2 and fa["final_accuracy_std"] is not None
    assert set(fa["time_to_accuracy_s"]) == {"0.5", "0.7", "0.8"}
    # Every update went through the coordinator core; FedAsync makes one version per update.
    ups = [e for e in lines if e["event"] == "update" and e["method"] == "fedasync" and e["seed"] == 0]
    assert [u["version"] for u in ups] == list(range(1, len(ups) + 1))
    assert all(u["energy_j"] > 0 and u["clock_levels"] for u in ups)
    evals = [e for e in lines if e["event"] == "eval" and e["method"] == "fedasync" and e["seed"] == 0]
    assert evals[-1]["accuracy"] > 1.0 / 6 + 0.1          # learns: above chance
    # The run's mean accuracy (AdaCLP's "average accuracy over a period") averages every evaluation.
    assert runs[("fedasync", 0)]["mean_accuracy"] == pytest.approx(
        np.mean([e["accuracy"] for e in evals]), abs=1e-6)
    assert fa["mean_accuracy"] == pytest.approx(
        np.mean([r["mean_accuracy"] for r in fa["runs"]])) and fa["mean_accuracy_std"] is not None
    assert [e["energy_j"] for e in evals] == sorted(e["energy_j"] for e in evals)
    _check_energy(summary, lines)


def test_fedavg_averages_several_updates_per_version(tmp_path):
    summary, _ = _run(tmp_path, "a", methods=["fedavg"])
    run = summary["methods"]["fedavg"]["runs"][0]
    assert run["updates_per_aggregation"] > 1.5 and set(run["staleness_histogram"]) == {"0"}


def test_fedavg_rounds_closed_by_the_deadline_count_in_the_figures(tmp_path):
    """With partial participation the devices that sit a round out never report, so rounds close
    at the deadline tick: they still make aggregate events and count in every figure."""
    devices = [{"count": 2, "board": "jetson-orin-nano", "participation": 0.4},
               {"count": 1, "board": "raspberry-pi-4", "speed": 3.0, "participation": 0.4}]
    coordinator = dict(TINY["coordinator"], fedavg={"deadline_s": 4.0})
    summary, lines = _run(tmp_path, "a", methods=["fedavg"], devices=devices, coordinator=coordinator)
    run = summary["methods"]["fedavg"]["runs"][0]
    aggs = [e for e in lines if e["event"] == "aggregate"]
    ups = [e for e in lines if e["event"] == "update"]
    assert [a["version"] for a in aggs] == list(range(1, run["versions"] + 1)) and aggs
    by_update = {u["time_s"] for u in ups if u["aggregated"]}
    assert any(a["time_s"] not in by_update for a in aggs), "no round closed at the deadline"
    assert all(a["n"] == len(a["devices"]) == len(a["staleness"]) >= 1 for a in aggs)
    assert run["aggregations"] == len(aggs)
    assert run["updates_per_aggregation"] == round(sum(a["n"] for a in aggs) / len(aggs), 3)
    assert sum(run["staleness_histogram"].values()) == sum(a["n"] for a in aggs)
    per_round = run["devices_per_round"]
    assert per_round["mean"] >= 1 and sum(per_round["histogram"].values()) == len(aggs)
    assert summary["methods"]["fedavg"]["updates_per_aggregation"] is not None


def test_a_bad_scenario_names_the_key():
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(dict(TINY, devices=[{"count": 2, "bord": "x"}]))
    assert "bord" in str(err.value)
    with pytest.raises(ConfigError):
        run_sim(scenario_from_dict(dict(TINY, methods=["nope"])), "/tmp/never-written")


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_simulator_and_daemon_agree_on_versions_and_weights(fleet, mqtt_broker):
    """Three real agents and a real coordinator over mosquitto; a plain client records every update
    frame in the broker's order and every global model the coordinator published; ``SimRun``'s
    coordinator path (its event queue, ``_arrive`` and ``_publish``) fed that order makes the same
    versions, each published one with bit-identical weights, and the same final model."""
    frames, models, lock, subscribed = [], [], threading.Lock(), threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="recorder", protocol=mqtt.MQTTv311)
    client.on_connect = lambda c, u, f, rc, p: c.subscribe([("streamfl/v1/+/device/+/update", 1),
                                                            ("streamfl/v1/+/model", 1)])
    client.on_subscribe = lambda *a: subscribed.set()

    def on_message(c, u, message):
        with lock:
            (models if message.topic.endswith("/model") else frames).append(bytes(message.payload))
    client.on_message = on_message
    client.connect(mqtt_broker.host, mqtt_broker.port, 30)
    client.loop_start()
    try:
        assert subscribed.wait(10)
        run = fleet()
        run.start_fleet(3)
        # The daemon coalesces its publishes; on a loaded machine 12 versions can go out as two
        # models, so the run also waits for a few published models to compare.
        run.wait_for(lambda: run.version() >= 12 and len(models) >= 4, 150,
                     "12 aggregations and 4 published models")
        run.stop_all()
        assert {p.popen.returncode for p in run.procs} == {0}, run.diagnostics()
    finally:
        client.disconnect()
        client.loop_stop()
    config = build(CoordinatorConfig, run.coordinator_config(), "test")
    saved, state = StateStore(run.coordinator_state).load(config.model)
    with lock:
        recorded, published = list(frames), list(models)
    sim = ReplayRun(config)
    replayed = dict(sim.feed(recorded))
    # The versions come from SimRun's own loop: one update event and one aggregate event each.
    sim_versions = [e["version"] for e in sim.events if e["event"] == "update" and e["aggregated"]]
    assert [e["version"] for e in sim.events if e["event"] == "aggregate"] == sim_versions
    daemon_versions = [u["version"] for u in run.updates() if u["aggregated"]]
    assert sim_versions == daemon_versions == list(range(1, state["version"] + 1))
    assert sorted(replayed) == list(range(state["version"] + 1))
    # Every model the daemon published (it coalesces, so not every version) matches the simulator's.
    decoder = Decoder({config.model.arch_id: tensor_spec(config.model)})
    daemon_models = [decoder.decode(f) for f in published]
    assert len({gm.version for gm in daemon_models}) >= 3
    for gm in daemon_models:
        assert set(gm.tensors) == set(replayed[gm.version])
        for name, value in gm.tensors.items():
            assert np.array_equal(value, replayed[gm.version][name]), (gm.version, name)
    final = replayed[state["version"]]
    assert set(final) == set(saved)
    for name in saved:
        assert np.array_equal(final[name], saved[name]), name
    assert replay_updates(config, recorded)[-1][0] == state["version"]


def test_a_device_that_leaves_mid_round_loses_that_update(tmp_path):
    """Session churn: a round the device cannot finish and upload before it leaves never reaches
    the coordinator, but the energy it spent until then counts."""
    devices = [{"count": 2, "board": "jetson-orin-nano"},
               {"count": 1, "board": "raspberry-pi-4", "speed": 40.0, "leave_s": 30.0},
               {"count": 1, "board": "jetson-nano", "speed": 160.0, "leave_s": 30.0}]
    summary, lines = _run(tmp_path, "a", methods=["fedasync"], devices=devices)
    totals = summary["methods"]["fedasync"]["runs"][0]["devices"]
    leaver = totals["dev-002"]
    assert leaver["lost_rounds"] >= 1 and leaver["train_s"] > 0
    assert totals["dev-003"]["lost_rounds"] >= 1      # a GPU board: its CPU share is billed too
    late = [e for e in lines if e["event"] == "update" and e["device"] == "dev-002" and e["time_s"] > 30.0]
    assert late == []
    # The lost round's work is billed: more training joules than its delivered updates carry.
    delivered_j = sum(e["energy_j"] for e in lines if e["event"] == "update" and e["device"] == "dev-002")
    assert leaver["train_energy_j"] > delivered_j
    _check_top_level_billing(summary["methods"]["fedasync"]["runs"][0])


def test_with_the_clp_probe_on_the_run_records_its_curve_and_the_report_draws_it(tmp_path):
    from streamfl.sim.report_html import render_report
    summary, lines = _run(tmp_path, "a", methods=["adaclp-no-dvfs"], plugins={"clp": {"trace_window": 3}})
    clp = [e for e in lines if e["event"] == "clp"]
    assert clp and all(e["fisher_global"] is None or e["fisher_global"] > 0 for e in clp)
    assert [e["version"] for e in clp] == sorted(e["version"] for e in clp)
    render_report(tmp_path / "a")
    assert (tmp_path / "a" / "clp.png").exists()


def test_adaclp_and_its_ablations_run_side_by_side(tmp_path):
    summary, lines = _run(tmp_path, "a", methods=["adaclp", "adaclp-no-dvfs", "adaclp-fixed-low"],
                          duration_s=40.0)
    assert set(summary["methods"]) == {"adaclp", "adaclp-no-dvfs", "adaclp-fixed-low"}
    for method in summary["methods"]:
        assert any(e["event"] == "clp" and e["method"] == method for e in lines), method

    def levels(method):
        return [lv for e in lines if e["event"] == "update" and e["method"] == method
                for lv in e["clock_levels"].values()]
    assert set(levels("adaclp-fixed-low")) == {0}                 # the lowest level throughout
    assert 0 not in levels("adaclp-no-dvfs")                      # untouched: boards boot at the top
    energy = {m: s["energy_j"] for m, s in summary["methods"].items()}
    assert energy["adaclp-fixed-low"] != energy["adaclp-no-dvfs"]
    # Rounds at every level the policies chose are billed by the utilization-weighted model.
    _check_energy(summary, lines)


def test_fisher_and_fedcurv_statistics_are_charged_to_the_round(tmp_path):
    # Same streams, devices and hparams: the methods that compute statistics after training pay
    # for them in round time, which a plain FedAsync device does not.
    summary, lines = _run(tmp_path, "a", methods=["fedasync", "adaclp-no-dvfs", "afedcurv"],
                          duration_s=30.0,
                          agent=dict(TINY["agent"], plugins={"clp": {
                              "initial_lr": 0.05, "lr_max": 0.05, "initial_batch": 16, "batch_max": 16, "batch_min": 16}}))
    per_sample = {}
    for method in ("fedasync", "adaclp-no-dvfs", "afedcurv"):
        ups = [e for e in lines if e["event"] == "update" and e["method"] == method]
        assert ups, method
        per_sample[method] = sum(e["train_s"] for e in ups) / sum(e["num_samples"] for e in ups)
    assert all(e.get("fisher_trace") is None for e in lines
               if e["event"] == "update" and e["method"] == "fedasync")
    assert per_sample["adaclp-no-dvfs"] > 1.05 * per_sample["fedasync"]
    assert per_sample["afedcurv"] > 1.2 * per_sample["fedasync"]


def test_a_round_that_diverges_is_counted_and_the_run_goes_on(tmp_path):
    # FedCurv's penalty at its strongest, with the boards' stability cap lifted to 100 (lr * c up
    # to 100: each step multiplies the distance to the peers' target by 99), makes local training
    # blow up once peers' sums exist; as on a board (agent/daemon.py), that round sends nothing
    # and the device goes on.
    summary, lines = _run(tmp_path, "a", methods=["afedcurv"], duration_s=40.0,
                          plugins={"fedcurv": {"penalty_strength": 1e4}},
                          coordinator={"hparams": {"lr": 0.05, "batch_size": 16, "local_steps": 30}},
                          agent=dict(TINY["agent"], plugins={"fedcurv": {"stability": 100.0}}))
    run = summary["methods"]["afedcurv"]["runs"][0]
    diverged = [e for e in lines if e["event"] == "diverged"]
    assert run["diverged_rounds"] == len(diverged) > 0
    assert sum(d["diverged_rounds"] for d in run["devices"].values()) == len(diverged)
    assert max(e["time_s"] for e in lines if e["event"] == "eval") == pytest.approx(40.0)
    assert all(np.isfinite(e["accuracy"]) for e in lines if e["event"] == "eval")
    # The diverged rounds' work is billed as any other round's.
    _check_top_level_billing(run)


def test_an_update_the_codec_refuses_is_lost_and_the_run_goes_on(tmp_path, monkeypatch):
    # An agent that sends a Fisher diagonal past its declared bounds (as one without the agent's
    # own check would, its training blown up): the coordinator's codec refuses the whole update,
    # in the simulator as on the coordinator's server, and the run goes on without it.
    import streamfl.agent.plugin_set as plugin_set
    import streamfl.methods.fedcurv.agent as fedcurv_agent
    real = fedcurv_agent.fisher_diagonal
    monkeypatch.setattr(fedcurv_agent, "fisher_diagonal",
                        lambda *a, **k: {n: f + 1.4e5 for n, f in real(*a, **k).items()})
    monkeypatch.setattr(plugin_set.DevicePlugins, "_within_bounds", lambda self, extra: True)
    summary, lines = _run(tmp_path, "a", methods=["afedcurv"], duration_s=20.0)
    refused = [e for e in lines if e["event"] == "refused_frame"]
    assert refused and all(e["device_id"].startswith("dev-") for e in refused)
    assert not any(e["event"] == "update" for e in lines)  # every update carried the diagonal
    assert max(e["time_s"] for e in lines if e["event"] == "eval") == pytest.approx(20.0)
    assert summary["methods"]["afedcurv"]["runs"][0]["versions"] == 0
