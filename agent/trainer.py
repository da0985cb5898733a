"""The local SGD loop, apart from the agent core so regularizers (EWC) and statistics (Fisher) plug in.

``LocalTrainer.run`` takes minibatches already sampled from the buffer and returns what the round
measured; penalty hooks add terms such as ST-EWC's spatial/temporal penalties (ST-EWC eq. 8 and 12): a
``QuadraticPull`` (``agent/quadratic.py``) straight to the gradients, merged and bounded for the
round's lr (``quadratic.bound``: no pull may make SGD overshoot its target), a ``Distillation``
(``agent/distillation.py``) to the loss with the batch's windows and logits, any other penalty to
the loss.
"""
import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from streamfl.agent.distillation import Distillation
from streamfl.agent.quadratic import Merged, QuadraticPull, bound, stability_of

log = logging.getLogger(__name__)

#: ``penalty(model) -> scalar tensor`` added to each step's loss (e.g. an EWC term).
Penalty = Callable[[nn.Module], torch.Tensor]


@dataclass
class TrainResult:
    """What one local round did: steps, samples processed, mean loss, label counts of the batches."""

    steps: int
    num_samples: int
    mean_loss: float
    losses: List[float] = field(default_factory=list)
    class_counts: Dict[int, int] = field(default_factory=dict)


@dataclass
class TrainingJob:
    """One round's SGD apart from the core that planned it: what ``run_job`` needs, in this process
    or in another (the simulator's round workers get it with the start weights)."""

    batches: Iterable[Tuple[np.ndarray, np.ndarray]]
    lr: float
    dropout: float
    #: Seeds torch (dropout masks) for this round only, so the round is the same wherever it runs.
    torch_seed: int
    penalties: List[Penalty] = field(default_factory=list)
    momentum: float = 0.0
    weight_decay: float = 0.0


def run_job(model: nn.Module, trainer: "LocalTrainer", job: TrainingJob) -> TrainResult:
    """Train ``model`` (the one ``trainer`` steps) on ``job``: its dropout, penalties and lr, with
    torch seeded by the job inside a forked RNG (the caller's torch RNG is left as it was)."""
    model.set_dropout(job.dropout)
    trainer.penalties = list(job.penalties)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(job.torch_seed)
        return trainer.run(job.batches, job.lr)


class LocalTrainer:
    """Plain (momentum) SGD on cross-entropy; a fresh optimizer per round.

    The optimizer is rebuilt each round because the starting weights may be a new global model:
    momentum carried over from the previous local trajectory would push the new model along a stale
    direction.
    """

    def __init__(self, model: nn.Module, num_classes: int, momentum: float = 0.0,
                 weight_decay: float = 0.0):
        self.model = model
        self.num_classes = int(num_classes)
        self.momentum = float(momentum)
        self.weight_decay = float(weight_decay)
        self.penalties: List[Penalty] = []
        #: The merged pull the last round applied, after ``bound`` (empty: none), and how many of
        #: its elements the cap lowered: what a divergence report quotes.
        self.applied: Merged = {}
        self.capped = 0
        self._loss_fn = nn.CrossEntropyLoss()
        self._warned_non_finite = False

    def run(self, batches: Iterable[Tuple[np.ndarray, np.ndarray]], lr: float) -> TrainResult:
        """One SGD step per ``(X [B, T, C], y [B])`` batch with learning rate ``lr``."""
        model = self.model
        opt = torch.optim.SGD(model.parameters(), lr=float(lr), momentum=self.momentum,
                              weight_decay=self.weight_decay)
        model.train()
        # Quadratic pulls go in as one fused gradient per parameter, other penalties as loss terms.
        pulls = self.bounded_pulls(float(lr))
        terms = [p for p in self.penalties if not isinstance(p, QuadraticPull)]
        counts = np.zeros(self.num_classes, dtype=np.int64)
        losses: List[float] = []
        samples = 0
        for X, y in batches:
            xb = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32))
            yb = torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))
            opt.zero_grad(set_to_none=True)
            logits = model(xb)
            loss = self._loss_fn(logits, yb)
            for penalty in terms:
                loss = loss + (penalty.on_batch(model, xb, logits) if isinstance(penalty, Distillation)
                               else penalty(model))
            loss.backward()
            if pulls:
                QuadraticPull.add_gradients(pulls)
            opt.step()
            losses.append(float(loss.detach()))
            counts += np.bincount(y, minlength=self.num_classes)[:self.num_classes]
            samples += len(y)
        if not losses:
            return TrainResult(steps=0, num_samples=0, mean_loss=float("nan"))
        mean = float(np.mean(losses))
        if not np.isfinite(mean):  # the core reports it once, with its cause (agent/divergence.py)
            log.debug("local training diverged (mean loss %s)", mean)
        return TrainResult(steps=len(losses), num_samples=samples, mean_loss=mean, losses=losses,
                           class_counts={int(c): int(n) for c, n in enumerate(counts) if n})

    def bounded_pulls(self, lr: float) -> Merged:
        """This round's quadratic pulls merged and capped at the strictest ``stability / lr``;
        empty (with one WARNING per trainer) if they are not finite."""
        pulls = [p for p in self.penalties if isinstance(p, QuadraticPull)]
        self.applied, self.capped = {}, 0
        if not pulls:
            return {}
        merged: Optional[Merged] = QuadraticPull.merge(pulls, self.model)
        merged, self.capped = bound(merged, lr, stability_of(pulls))
        if merged is None:
            (log.debug if self._warned_non_finite else log.warning)(
                "the methods' quadratic pull is not finite: this round trains without it")
            self._warned_non_finite = True
            return {}
        if self.capped:
            log.debug("quadratic pull capped at stability %g / lr %g on %d elements",
                      stability_of(pulls), lr, self.capped)
        self.applied = merged
        return merged
