"""A scenario's data for its runs: the held-out set and each seed's partitions and streams.

Built once per seed and shared by every method of that seed, so methods are compared on identical
windows; the streams themselves are rebuilt per run (they carry their own random state). The
dataset itself comes from ``streamfl.sim.datasets``; the held-out windows are evaluated by
``streamfl.models.evaluation.Evaluator``, as the coordinator's are.
"""
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from streamfl.sim.scenario import Scenario


class SimData:
    """Held-out windows and per-device streams of one scenario's dataset."""

    def __init__(self, scenario: Scenario, dataset: Any):
        from streamfl.sim.datasets import dataset_shape
        self.scenario = scenario
        self.dataset = dataset
        #: (window_len T, in_channels C, num_classes K)
        self.shape: Tuple[int, int, int] = dataset_shape(dataset)
        self._split_seed: Optional[int] = None
        self._split: Any = None
        self._streams: List[Any] = []
        self._pretrained: Dict[int, Tuple[Any, Optional[float]]] = {}

    def _for_seed(self, seed: int):
        if self._split_seed != seed:
            from streamfl.sim.datasets import holdout
            from streamfl.sim.partition import partition
            sc = self.scenario
            train, test = holdout(self.dataset, sc.data.holdout, seed, by_subject=sc.data.holdout_by_subject)
            parts = partition(train, sc.num_devices, sc.data.partition, seed, beta=sc.data.beta,
                              shards_per_device=sc.data.shards_per_device,
                              classes_per_device=sc.data.classes_per_device)
            self._split_seed, self._split = seed, (train, test, parts)
        return self._split

    def streams(self, seed: int, clock: Any = None) -> List[Any]:
        """Fresh streams for one run (same seed, same windows, whatever the method); ``clock``:
        the run's ``AggregationClock``, for periods counted in aggregations."""
        from streamfl.sim.streams import make_streams
        train, _, parts = self._for_seed(seed)
        sc = self.scenario
        self._streams = make_streams(train, parts, sc.stream.kind, seed, sc.stream.windows_per_s,
                                     sc.duration_s, clock=clock, **sc.stream.params)
        return self._streams

    def eval_set(self, seed: int) -> Tuple[np.ndarray, np.ndarray]:
        """The held-out windows (at most ``scenario.eval_windows``, a fixed sample per seed)."""
        _, test, _ = self._for_seed(seed)
        X, y = test.X, test.y
        limit = self.scenario.eval_windows
        if limit is not None and len(y) > limit:
            pick = np.sort(np.random.default_rng(seed).choice(len(y), limit, replace=False))
            X, y = X[pick], y[pick]
        return X, y

    def pretrained(self, seed: int, spec: Any) -> Tuple[Optional[Any], Optional[float]]:
        """``(version-0 tensors, their accuracy on the held-out windows of the classes they were
        trained on)`` per the scenario's ``pretrain`` section, trained once per seed; ``(None,
        None)`` when it is off (the coordinator then builds version 0 from its seed)."""
        config = self.scenario.pretrain
        if not config.enabled:
            return None, None
        if seed not in self._pretrained:
            from streamfl.errors import ConfigError
            from streamfl.sim.pretrain import chosen_classes, held_out_accuracy, pretrain, select
            from streamfl.sim.streams import make_streams
            train, _, parts = self._for_seed(seed)
            sc = self.scenario
            meta = make_streams(train, parts, sc.stream.kind, seed, sc.stream.windows_per_s,
                                sc.duration_s, **sc.stream.params)[0].meta
            try:
                classes = chosen_classes(config, meta, self.shape[2])
                tensors = pretrain(spec, *select(train.X, train.y, classes), config, seed)
            except ValueError as exc:
                raise ConfigError("scenario %s: %s" % (sc.name, exc)) from exc
            accuracy = held_out_accuracy(spec, tensors, *select(*self.eval_set(seed), classes))
            self._pretrained[seed] = (tensors, accuracy)
        tensors, accuracy = self._pretrained[seed]
        return {k: v.copy() for k, v in tensors.items()}, accuracy

    def period(self, t_s: float) -> Optional[int]:
        """The streams' period at ``t_s`` (device 0's; None for streams without periods)."""
        if not self._streams:
            return None
        p = self._streams[0].period(t_s)
        return None if p is None else int(p)
