"""The session paper's Continuous baseline on the board: distillation toward the session's starting
model, kept from the first own model of each session the board saw begin."""
import pickle

import numpy as np
import pytest
import torch

from factories import make_global_model
from streamfl.agent.distillation import Distillation
from streamfl.agent.trainer import LocalTrainer
from streamfl.config import build
from streamfl.errors import ConfigError
from streamfl.methods.sessions.agent import SessionsAgentConfig, SessionsAgentPlugin
from streamfl.methods.sessions.payloads import SessionTerms
from streamfl.models import ModelSpec, build_model, model_to_arrays

SPEC = ModelSpec(name="mlp", in_channels=3, window_len=8, num_classes=4, hidden=16)


def _batches(n, seed=0, label=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(16, 8, 3)).astype(np.float32), np.full(16, label, dtype=np.int64))
            for _ in range(n)]


def test_the_term_is_zero_at_the_teacher_and_positive_away_from_it():
    model = build_model(SPEC, seed=1)
    term = Distillation(model_to_arrays(model), weight=1.0, temperature=2.0)
    xb = torch.from_numpy(_batches(1)[0][0])
    assert float(term.on_batch(model, xb, model(xb)).detach()) == pytest.approx(0.0, abs=1e-6)
    other = build_model(SPEC, seed=2)
    assert float(term.on_batch(other, xb, other(xb)).detach()) > 1e-4
    with pytest.raises(ValueError):
        Distillation(model_to_arrays(model), weight=float("nan"), temperature=2.0)


def test_a_round_with_the_term_stays_nearer_the_teachers_predictions():
    """Trained on one label only, a model forgets the teacher's other classes; the term keeps them."""
    teacher = build_model(SPEC, seed=1)
    probe = torch.from_numpy(_batches(1, seed=9)[0][0])
    with torch.no_grad():
        target = torch.softmax(teacher(probe), dim=1)

    def trained(penalties):
        model = build_model(SPEC, seed=1)
        trainer = LocalTrainer(model, SPEC.num_classes)
        trainer.penalties = penalties
        trainer.run(_batches(30, label=0), lr=0.2)
        with torch.no_grad():
            return float((torch.softmax(model(probe), dim=1) - target).abs().sum(dim=1).mean())

    plain = trained([])
    kept = trained([Distillation(model_to_arrays(teacher), weight=1.0, temperature=2.0)])
    assert kept < 0.7 * plain          # about half as far here (0.74 against 1.40)


def test_it_travels_to_a_round_worker_as_arrays_and_works_there():
    teacher = build_model(SPEC, seed=1)
    term = Distillation(model_to_arrays(teacher), weight=1.0, temperature=2.0)
    xb = torch.from_numpy(_batches(1)[0][0])
    other = build_model(SPEC, seed=2)
    before = float(term.on_batch(other, xb, other(xb)).detach())           # builds the teacher's module
    copy = pickle.loads(pickle.dumps(term))
    assert copy._module is None
    assert float(copy.on_batch(other, xb, other(xb)).detach()) == pytest.approx(before)


def _gm(version, session, aux_round=0, value=0.0):
    return make_global_model(SPEC, version=version, value=value,
                             extras={"session": SessionTerms(session, aux_round)})


def test_the_teacher_is_the_first_own_model_of_a_session_the_board_saw_begin():
    plugin = SessionsAgentPlugin(SessionsAgentConfig(distill_weight=1.0))
    model = build_model(SPEC)
    plugin.on_model_received(_gm(1, 0, value=0.1), {})
    assert plugin.before_round(model) is None               # session 0: nothing before it
    plugin.on_model_received(_gm(2, 0, value=0.2), {})
    plugin.on_model_received(_gm(3, 1, aux_round=1, value=0.3), {})   # an auxiliary model: not it
    assert plugin.before_round(model) is None
    plugin.on_model_received(_gm(4, 1, value=0.4), {})
    plugin.on_model_received(_gm(5, 1, value=0.5), {})
    term = plugin.before_round(model)
    assert isinstance(term, Distillation) and term.weight == 1.0 and term.temperature == 2.0
    assert all(np.all(t == np.float32(0.4)) for t in term.teacher.values())
    plugin.on_model_received(_gm(6, 2, value=0.6), {})
    assert all(np.all(t == np.float32(0.6)) for t in plugin.before_round(model).teacher.values())


def test_a_board_joining_mid_session_waits_for_the_next_and_weight_0_is_off():
    joined = SessionsAgentPlugin(SessionsAgentConfig(distill_weight=1.0))
    joined.on_model_received(_gm(7, 3), {})
    joined.on_model_received(_gm(8, 3), {})
    assert joined.before_round(build_model(SPEC)) is None
    joined.on_model_received(_gm(9, 4), {})
    assert joined.before_round(build_model(SPEC)) is not None
    off = SessionsAgentPlugin(SessionsAgentConfig())
    for version, session in ((1, 0), (2, 1), (3, 1)):
        off.on_model_received(_gm(version, session), {})
    assert off.before_round(build_model(SPEC)) is None and off.teacher is None


@pytest.mark.parametrize("bad", [{"distill_weight": -1.0}, {"distill_weight": float("nan")},
                                 {"distill_weight": float("inf")}, {"distill_temperature": 0.0}])
def test_bad_distillation_settings_are_refused(bad):
    with pytest.raises(ConfigError):
        build(SessionsAgentConfig, bad, "plugins.sessions")
