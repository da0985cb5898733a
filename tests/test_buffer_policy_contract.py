"""The contract every buffer replacement policy keeps (``streamfl.agent.buffer_policies.POLICIES``).

Whatever a policy admits or evicts, the buffer stays consistent: counts match the labels held,
size never exceeds capacity, stored windows are the ones offered, the same seed keeps the same
windows, and a policy never changes the buffer it is shown. Behaviour particular to one policy
(FIFO keeps the newest, the reservoir a uniform sample) is checked below the contract.
"""
import numpy as np
import pytest

from streamfl.agent.buffer import Buffer
from streamfl.agent.buffer_policies import ReplacementPolicy, make_buffer_policy, policies
from streamfl.agent.config import AgentConfig
from streamfl.agent.core import AgentCore
from streamfl.errors import ConfigError
from streamfl.config import build

T, C, K = 3, 3, 4


def stream(n, seed=0):
    """``n`` windows whose first value is their index in the stream, with labels in [0, K)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, K, size=n)
    for i in range(n):
        x = np.full((T, C), float(i), dtype=np.float32)
        yield x, int(labels[i])


def fill(name, capacity=16, n=200, seed=0):
    buf = Buffer(capacity, T, C, K, policy=make_buffer_policy(name, seed))
    kept = [buf.add(x, y) for x, y in stream(n)]
    return buf, kept


class Watching(ReplacementPolicy):
    """Wraps a policy and checks it leaves the buffer as it found it."""

    def __init__(self, inner):
        self.inner = inner

    @staticmethod
    def _snapshot(buffer):
        return (buffer.X.copy(), buffer.y.copy(), list(buffer.counts), buffer.size, buffer.oldest_slot)

    def _same(self, before, buffer):
        after = self._snapshot(buffer)
        assert np.array_equal(before[0], after[0]) and np.array_equal(before[1], after[1])
        assert before[2:] == after[2:]

    def admit(self, label, buffer, state=-1, window=None):
        before = self._snapshot(buffer)
        out = self.inner.admit(label, buffer, state, window=window)
        self._same(before, buffer)
        return out

    def victim(self, label, buffer):
        before = self._snapshot(buffer)
        out = self.inner.victim(label, buffer)
        self._same(before, buffer)
        return out


@pytest.mark.parametrize("name", sorted(policies()))
class TestBufferPolicyContract:

    def test_it_is_registered_under_its_name_and_builds_from_a_seed(self, name):
        policy = make_buffer_policy(name, seed=3)
        assert isinstance(policy, ReplacementPolicy) and policy.name == name

    def test_the_buffer_stays_consistent(self, name):
        buf, kept = fill(name)
        assert buf.size == buf.capacity == 16
        assert buf.counts == np.bincount(buf.y[:buf.size], minlength=K).tolist()
        assert buf.stored == sum(kept) and buf.refused == len(kept) - sum(kept)
        offered = {i: y for i, (_, y) in enumerate(stream(200))}
        held = [int(x[0, 0]) for x in buf.X[:buf.size]]
        assert len(set(held)) == len(held)                               # no window twice
        assert all(offered[i] == int(y) for i, y in zip(held, buf.y))    # each with its own label

    def test_until_full_every_window_is_admitted_in_order(self, name):
        buf, kept = fill(name, capacity=16, n=16)
        assert all(kept) and [int(x[0, 0]) for x in buf.X] == list(range(16))

    def test_the_same_seed_keeps_the_same_windows(self, name):
        a, _ = fill(name, seed=5)
        b, _ = fill(name, seed=5)
        assert np.array_equal(a.X, b.X) and np.array_equal(a.y, b.y)

    def test_the_policy_never_changes_the_buffer(self, name):
        buf = Buffer(8, T, C, K, policy=Watching(make_buffer_policy(name, 0)))
        for x, y in stream(60):
            buf.add(x, y)
        assert buf.size == 8

    def test_the_agent_builds_it_from_its_config(self, name):
        cfg = build(AgentConfig, {"device_id": "d1", "buffer_policy": name,
                                  "model": {"name": "mlp", "in_channels": C, "window_len": T,
                                            "num_classes": K, "hidden": 4},
                                  "sensor": {"channels": C, "window_len": T, "num_classes": K}}, "test")
        assert AgentCore(cfg).buffer.policy.name == name


def test_an_unknown_policy_is_a_config_error():
    with pytest.raises(ConfigError, match="buffer_policy"):
        build(AgentConfig, {"device_id": "d1", "buffer_policy": "lru"}, "test")


def test_fifo_keeps_the_newest_windows():
    buf, kept = fill("fifo")
    assert all(kept) and sorted(int(x[0, 0]) for x in buf.X) == list(range(184, 200))


def test_the_reservoir_keeps_a_uniform_sample_of_the_whole_stream():
    """Each of the n windows is held with probability capacity / n: over many seeds, the first and
    the second half of the stream are held about equally often, where FIFO holds only the last."""
    early = late = 0
    for seed in range(200):
        buf, _ = fill("reservoir", capacity=16, n=200, seed=seed)
        held = [int(x[0, 0]) for x in buf.X]
        early += sum(i < 100 for i in held)
        late += sum(i >= 100 for i in held)
    assert early + late == 200 * 16
    assert abs(early - late) / (early + late) < 0.05       # expected 0; sd about 0.009
