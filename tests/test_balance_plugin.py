"""Class-balanced mixing: the tracked class composition is the model's own exponential average,
updates of over-represented classes are mixed in lightly, rare ones at the strategy's weight, and
devices whose update weighed little are told to rest when asked to."""
import pytest

from factories import make_hello, make_update
from streamfl.config import build
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.methods.balance.coordinator import BalanceConfig, class_mix
from streamfl.errors import ConfigError
from streamfl.models import ModelSpec

SPEC = ModelSpec(name="mlp", in_channels=2, window_len=4, num_classes=4, hidden=4)

DEVICES = ("d0", "d1", "d2", "d3")


def core(strategy="fedasync", **balance):
    balance.setdefault("power", 1.0)  # the arithmetic below reads plainer without the exponent
    settings = {"model": SPEC, "strategy": strategy, "alpha": 0.5, "staleness": "constant",
                "plugins": {"balance": balance}, "fedavg": {"deadline_s": 5.0}}
    c = CoordinatorCore(build(CoordinatorConfig, settings, "test"))
    for i, d in enumerate(DEVICES):
        c.on_message(make_hello(d, SPEC), 0.01 * i)
    return c


def send(c, device, classes, t, samples=8):
    step = c.on_message(make_update(SPEC, device_id=device, base_version=c.version,
                                    class_counts=classes, num_samples=samples), t)
    return step


def mixing(step):
    """The share FedAsync gave the update ``step`` aggregated, as the core reported it."""
    (made,) = [a for a in step.aggregations if not a.switched_by]
    return made.mixing_weight


def test_class_mix_is_the_counts_as_fractions():
    assert class_mix(make_update(SPEC, class_counts={0: 3, 2: 1})) == {0: 0.75, 2: 0.25}
    assert class_mix(make_update(SPEC, class_counts={})) == {}


def test_the_composition_follows_the_mixing_weights():
    c = core()
    plugin = c.plugin("balance")
    step = send(c, "d0", {0: 8}, 1.0)  # first update: nothing to balance against, full weight
    assert mixing(step) == pytest.approx(0.5)
    assert plugin.composition == {0: 1.0}
    step = send(c, "d1", {1: 8}, 2.0)  # class 1 is absent from the model: the strategy's weight
    assert mixing(step) == pytest.approx(0.5)
    assert plugin.composition == pytest.approx({0: 0.5, 1: 0.5})


def test_an_over_represented_class_is_mixed_in_lightly():
    c = core(floor=0.05)
    plugin = c.plugin("balance")
    send(c, "d0", {0: 8}, 1.0)
    send(c, "d1", {1: 8}, 2.0)
    step = send(c, "d2", {0: 8}, 3.0)  # composition {0: .5, 1: .5}, target .5: factor 1
    assert mixing(step) == pytest.approx(0.5)
    m0 = plugin.composition[0]
    assert m0 == pytest.approx(0.75)
    step = send(c, "d3", {0: 8}, 4.0)  # class 0 fills 3/4 of the model: factor .5 / .75
    assert mixing(step) == pytest.approx(0.5 * 0.5 / 0.75)
    assert step.update.as_event()["balance_factor"] == pytest.approx(0.5 / 0.75, abs=1e-4)
    step = send(c, "d1", {1: 8}, 5.0)  # the rarer class keeps the full weight
    assert mixing(step) == pytest.approx(0.5)


def test_power_sharpens_the_shortfall():
    c = core(floor=0.05, power=3.0)
    send(c, "d0", {0: 8}, 1.0)
    send(c, "d1", {1: 8}, 2.0)
    send(c, "d2", {0: 8}, 3.0)
    step = send(c, "d3", {0: 8}, 4.0)
    assert mixing(step) == pytest.approx(0.5 * (0.5 / 0.75) ** 3)


def test_the_floor_bounds_the_factor_and_counts_without_classes_weigh_fully():
    c = core(floor=0.4)
    for k in range(4):  # four classes seen: target 1/4, which class 0 overshoots below
        send(c, "d1", {k: 8}, 1.0 + k)
    for t in range(5, 60):
        step = send(c, "d2", {0: 8}, float(t))
    assert c.plugin("balance").composition[0] > 0.7
    assert mixing(step) == pytest.approx(0.5 * 0.4)
    step = send(c, "d3", {}, 10.0)
    assert mixing(step) == pytest.approx(0.5)


def test_a_device_weighted_below_rest_below_is_told_to_skip():
    c = core(floor=0.05, rest_below=0.7, rest_rounds=7)
    send(c, "d0", {0: 8}, 1.0)
    send(c, "d1", {1: 8}, 2.0)
    send(c, "d2", {0: 8}, 3.0)
    step = send(c, "d3", {0: 8}, 4.0)  # factor 2/3 < 0.7
    assert [(a.device_id, a.command.kind, a.command.params) for a in step.commands] == [
        ("d3", "skip", {"rounds": 7})]
    assert c.plugin("balance").rested == 1
    quiet = send(c, "d1", {1: 8}, 5.0)
    assert quiet.commands == []


def test_a_fedavg_round_mixes_its_sample_weighted_classes():
    c = core(strategy="fedavg")
    plugin = c.plugin("balance")
    for d, classes, n in (("d0", {0: 8}, 30), ("d1", {1: 8}, 10), ("d2", {1: 8}, 0), ("d3", {2: 8}, 0)):
        send(c, d, classes, 1.0, samples=n)
    assert c.version == 1
    assert plugin.composition == pytest.approx({0: 30 / 42, 1: 11 / 42, 2: 1 / 42})


def test_state_survives_a_restart_and_bad_settings_are_refused():
    c = core()
    send(c, "d0", {0: 8}, 1.0)
    send(c, "d1", {1: 8}, 2.0)
    again = core()
    again.plugin("balance").load_state(c.plugin("balance").state())
    assert again.plugin("balance").composition == pytest.approx({0: 0.5, 1: 0.5})
    for bad in ([1, 2], {"0": float("nan")}, {"0": 2.0}, {"-1": 0.5}):
        with pytest.raises(ValueError, match="composition"):
            again.plugin("balance").load_state({"composition": bad})
    for bad in ({"floor": 0.0}, {"floor": 1.5}, {"rest_below": 0.0}, {"rest_rounds": 0}):
        with pytest.raises((ValueError, ConfigError)):
            build(BalanceConfig, bad, "balance")


def test_in_the_simulator_the_shared_class_weighs_less_and_its_devices_rest(tmp_path):
    """A small extreme run: most devices on the shared class, the others on their own; the shared
    class's updates are weighted down, and with rests the fleet trains less than FedAsync."""
    import json

    from streamfl.sim.driver import Progress, run_sim
    from streamfl.sim.scenario import scenario_from_dict

    values = {
        "name": "balance", "duration_s": 12.0, "model": {"name": "cnn1d", "hidden": 8},
        "data": {"dataset": "synthetic", "n_windows": 600, "partition": "subject",
                 "classes_per_device": [2, 3]},
        "stream": {"kind": "extreme", "windows_per_s": 5.0,
                   "params": {"mu_aggregations": 20, "sigma_aggregations": 0, "missing": "local",
                              "shared_order": True}},
        "devices": [{"count": 4, "board": "jetson-orin-nano"}],
        "methods": ["fedasync", "fedasync+balance-rest"], "eval_every_s": 2.0, "eval_windows": 100,
        "agent": {"min_buffer": 8, "buffer_capacity": 16, "round_interval_s": 0.05},
        "coordinator": {"hparams": {"lr": 0.05, "batch_size": 8, "local_steps": 2}},
    }
    out = tmp_path / "run"
    summary = run_sim(scenario_from_dict(values), out, progress=Progress(1, stream=open("/dev/null", "w")))
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    factors = [e["balance_factor"] for e in events
               if e["event"] == "update" and e["method"] == "fedasync+balance-rest" and "balance_factor" in e]
    assert factors and min(factors) < 0.25 and max(factors) == 1.0
    assert not any("balance_factor" in e for e in events if e.get("method") == "fedasync")
    train = {m: v["train_energy_j"] for m, v in summary["methods"].items()}
    assert train["fedasync+balance-rest"] < train["fedasync"]
