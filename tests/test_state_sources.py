"""The contract every latent-state source keeps (``streamfl.methods.sfedpo.latent.SOURCES``), and what each
one does of its own: the window's state where it has one, inference from the label mix otherwise."""
import numpy as np
import pytest

from streamfl.methods.sfedpo.latent import SOURCES, GivenStates, InferredStates, StateSource, make_state_source
from streamfl.sensors.window import UNLABELLED, Window

K = 4


def windows(n, seed=0, state=-1):
    rng = np.random.default_rng(seed)
    labels = np.concatenate([np.zeros(n // 2, int), rng.integers(0, K, size=n - n // 2)])
    return [Window(np.zeros((3, 2), np.float32), int(y), float(i), state) for i, y in enumerate(labels)]


@pytest.mark.parametrize("name", sorted(SOURCES))
class TestStateSourceContract:

    def test_it_builds_by_name_and_gives_ids_in_range(self, name):
        source = make_state_source(name, K)
        assert isinstance(source, StateSource) and source.name == name
        ids = [source.state_of(w) for w in windows(200)]
        assert all(isinstance(s, int) and s >= -1 for s in ids)

    def test_the_same_stream_gives_the_same_states(self, name):
        a, b = make_state_source(name, K), make_state_source(name, K)
        assert [a.state_of(w) for w in windows(200)] == [b.state_of(w) for w in windows(200)]

    def test_unlabelled_windows_are_taken(self, name):
        source = make_state_source(name, K)
        assert source.state_of(Window(np.zeros((3, 2), np.float32), UNLABELLED)) >= -1


def test_given_states_pass_the_windows_own_and_fall_back_for_the_rest():
    source = GivenStates()
    assert [source.state_of(w) for w in windows(5, state=7)] == [7] * 5 and source.shared_ids
    assert source.state_of(windows(1)[0]) == 0 and not source.shared_ids and source.missing == 1


def test_inference_tells_a_skewed_mix_from_a_balanced_one_and_comes_back():
    source = InferredStates(K, history=16, every=4)
    rng = np.random.default_rng(3)
    seq = [0] * 64 + list(rng.integers(0, K, size=64)) + [0] * 64
    ids = [source.state_of(Window(np.zeros((3, 2), np.float32), int(y))) for y in seq]
    assert ids[63] == 0 and ids[127] == 1 and ids[-1] == 0
    assert len(source.centroids) == 2


def test_inference_is_bounded():
    source = InferredStates(K, history=4, every=4, threshold=0.05, max_states=2)
    for c in range(K):
        for _ in range(16):
            source.state_of(Window(np.zeros((3, 2), np.float32), c))
    assert len(source.centroids) == 2


@pytest.mark.parametrize("bad", [{"history": 0}, {"threshold": 0.0}, {"threshold": float("nan")},
                                 {"max_states": 0}])
def test_bad_inference_settings_are_refused(bad):
    with pytest.raises(ValueError):
        InferredStates(K, **bad)


def test_unknown_source_is_refused_by_name():
    with pytest.raises(ValueError, match="known"):
        make_state_source("oracle", K)
