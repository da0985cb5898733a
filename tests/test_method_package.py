"""A method is one package: the toy method in tests/toy_method/ runs without a line of streamfl
changed, loaded as another distribution's entry point in a fresh process, or registered by a
program; its payload types reach the codec through its registration."""
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from factories import SPEC, make_global_model
from streamfl import methods
from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore
from streamfl.config import build
from streamfl.protocol.codec import Decoder, encode
from streamfl.models import tensor_spec

HERE = Path(__file__).resolve().parent
SMOKE = HERE.parent / "configs" / "scenarios" / "smoke.yaml"


@pytest.fixture
def toy():
    import toy_method
    methods.register(toy_method.METHOD)
    try:
        yield toy_method
    finally:
        methods.unregister("toy")


def _installed(tmp_path: Path) -> Path:
    """The toy package and a dist-info declaring it under the ``streamfl.methods`` entry points,
    as ``pip install`` of another distribution would leave them."""
    site = tmp_path / "site"
    shutil.copytree(HERE / "toy_method", site / "toy_method")
    info = site / "toy_method-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-method\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[streamfl.methods]\ntoy = toy_method:METHOD\n")
    return site


def test_an_installed_method_runs_in_the_simulator_by_name(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(_installed(tmp_path)))
    proc = subprocess.run([sys.executable, "-m", "streamfl.cli", "sim", str(SMOKE), "--seeds", "1",
                           "--duration", "20", "--methods", "toy-fedasync", "--out", str(out)],
                          env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in records if r.get("event") == "update" and r.get("outcome") == "aggregated"]
    assert updates and all(r["toy_windows"] > 0 for r in updates)   # the device side reported


def test_a_registered_method_steers_devices_only_while_the_fleet_runs_it(toy):
    core = AgentCore(build(AgentConfig, {"device_id": "d1", "model": dataclasses.asdict(SPEC),
                                         "sensor": {"kind": "mqtt", "window_len": SPEC.window_len,
                                                    "channels": SPEC.in_channels,
                                                    "num_classes": SPEC.num_classes}}, "test"))
    lr = core.hparams["lr"]
    plain = make_global_model(version=1, hparams={"lr": lr})
    assert core.on_global_model(plain) and core.hparams["lr"] == pytest.approx(lr)
    with_toy = make_global_model(version=2, hparams={"lr": lr}, extras={"toy": toy.payloads.ToyTerms(0.25)})
    assert core.on_global_model(with_toy) and core.hparams["lr"] == pytest.approx(lr * 0.25)


def test_its_payloads_reach_the_codec_through_its_registration(toy):
    gm = make_global_model(version=1, extras={"toy": toy.payloads.ToyTerms(0.5)})
    decoded = Decoder({SPEC.arch_id: tensor_spec(SPEC)}).decode(encode(gm))
    assert decoded.extras["toy"] == toy.payloads.ToyTerms(0.5)
    with pytest.raises(Exception, match="lr_scale"):           # its bounds hold on the wire too
        bad = make_global_model(version=1, extras={"toy": toy.payloads.ToyTerms(5.0)})
        Decoder({SPEC.arch_id: tensor_spec(SPEC)}).decode(encode(bad))


def test_a_method_name_is_taken_once(toy):
    with pytest.raises(ValueError, match="already registered"):
        methods.register(toy.METHOD)
    with pytest.raises(ValueError, match="ships with streamfl"):
        methods.unregister("clp")
