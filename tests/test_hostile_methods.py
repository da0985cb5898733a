"""Hostile values through the methods' side channels, over a real broker (six
attacks): a forged FedCurv diagonal, a forged SFedPO availability, a flood of bounded updates, a
forged ST-EWC T-FDM, forged AdaCLP traces and forged marks of answers to a sessions auxiliary round. Each is refused at decoding where it is out of its
declared range and bounded by its peers' median where it is in range; an attacked run ends within
2 points of held-out accuracy of a clean run with the same seeds, and a flood locks nobody out,
before or after a restart.

The fleet is mosquitto, the real ``CoordinatorServer`` with the method's plug-in, the codec, and
three honest ``AgentCore``s the test drives (``tests/hostile.py``): each trains from the newest
version and waits for the verdict on its update, so a clean and an attacked run see the same
sequence of honest rounds; their plug-ins wake up from the global model's extras, as on a board.
Mallory is a registered device that publishes forged frames on its own topics, once per round
(after the last honest device's turn), except in the flood. A clean run never registers Mallory.
"""
import math
import threading
import time

import numpy as np
import pytest

from factories import make_hello, make_tensors, make_update
from hostile import SPEC, Client, coordinator, honest_agent
from polling import updates_handled, wait_for, wait_until
from streamfl.methods.clp.hparams import ClpHparamsConfig
from streamfl.agent.core import RoundMeasurement
from streamfl.coordinator.admission import AdmissionConfig
from streamfl.methods.clp.probe import ClpProbeConfig
from streamfl.coordinator.metrics import read_metrics
from streamfl.methods.fedcurv.coordinator import FedCurvConfig
from streamfl.methods.sfedpo.coordinator import SfedpoConfig
from streamfl.methods.stewc.coordinator import StEwcConfig
from streamfl.protocol.codec import encode
from streamfl.protocol.bounds import FISHER_DIAGONAL, FISHER_TRACE
from streamfl.methods.clp.payloads import ClpState
from streamfl.methods.fedcurv.payloads import CurvatureDiagonal, CurvatureTerms
from streamfl.methods.clp.payloads import FisherTrace
from streamfl.methods.stewc.payloads import PeriodFisher, PeriodTerms
from streamfl.methods.sfedpo.payloads import MIN_AVAILABILITY, SfedpoReport
from streamfl.methods.sessions.payloads import SessionAux
from streamfl.sim.brokers import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

HONEST = 3
ROUNDS = 12
MALLORY = "mallory"
#: Hostile values may cost at most 2 points of held-out accuracy.
POINTS = 0.02
#: The round after which Mallory starts where an attack needs a fleet past admission's warm-up
#: (``warmup_updates`` 10 norms; three honest devices send 12 in four rounds), as in the issue,
#: where each attack hit a fleet that had learned the task.
AFTER_WARMUP = 4


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """One broker for the module: the runs of a scenario share it, each with its own state folder."""
    proc = BrokerProcess(tmp_path_factory.mktemp("broker")).start()
    try:
        yield proc
    finally:
        proc.stop()


def norm(tensors):
    return float(math.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in tensors.values())))


def total(tensors):
    return float(sum(float(a.sum(dtype=np.float64)) for a in tensors.values()))


def negated(model):
    """The sign-flipped model: admission clips its delta (twice the model) to the bound."""
    return {k: -a for k, a in model.tensors.items()}


class Fleet:
    """A coordinator of ``name`` with three honest devices (and Mallory, when ``attacked``), all
    registered, the first model received."""

    def __init__(self, broker, tmp_path, name, attacked, **over):
        self.name = name
        self.server = coordinator(broker, tmp_path, name, **over)
        self.agents = [honest_agent(i) for i in range(HONEST)]
        self.devices = [Client(broker, "%s-pi-%d" % (name, i)) for i in range(HONEST)]
        self.mallory = Client(broker, "%s-%s" % (name, MALLORY)) if attacked else None
        for agent, dev in zip(self.agents, self.devices):
            dev.send("status", make_hello(agent.device_id, SPEC), agent.device_id)
        if attacked:
            self.mallory.send("status", make_hello(MALLORY, SPEC), MALLORY)
        wait_until(lambda: len(self.server.core.online()) == HONEST + bool(attacked), what="devices registered")
        wait_until(lambda: all(d.version() == 0 for d in self.devices), what="the first model")
        self.turns, self.noted = [], []

    # ---- honest devices -------------------------------------------------------------------------
    def turn(self, k):
        """Device k trains one round from the newest version and sends it; waits for the
        coordinator's verdict. ``(model trained from, update, aggregated, hparams)``."""
        dev, agent = self.devices[k], self.agents[k]
        version = self.server.core.version
        assert wait_for(lambda: dev.version() == version, timeout_s=10), (dev.version(), version)
        model = dev.model
        agent.on_global_model(model)
        update = agent.train_round()
        return model, update, self.verdict(dev, update) == "aggregated", dict(agent.hparams)

    def verdict(self, client, update):
        """``client`` sends ``update``; "aggregated", "rejected" or "stale" once the core decided."""
        c = self.server.core.counters
        version, rejected, stale = self.server.core.version, c["rejected"], c["stale_dropped"]
        client.send("update", update, update.device_id)
        outcomes = (("aggregated", lambda: self.server.core.version == version + 1),
                    ("rejected", lambda: c["rejected"] == rejected + 1),
                    ("stale", lambda: c["stale_dropped"] == stale + 1))
        wait_until(lambda: any(done() for _, done in outcomes), timeout_s=10,
                   what="the verdict on %s's update" % update.device_id)
        return next(outcome for outcome, done in outcomes if done())

    def newest(self):
        """The newest global model, as the devices hold it once the coordinator published it."""
        version = self.server.core.version
        assert wait_for(lambda: self.devices[0].version() == version, timeout_s=10)
        return self.devices[0].model

    # ---- Mallory --------------------------------------------------------------------------------
    def forge(self, base, **fields):
        """Mallory's update trained (it says) from ``base``, with its tensors unless given."""
        fields.setdefault("tensors", base.tensors)
        return make_update(SPEC, device_id=MALLORY, base_version=base.version, **fields)

    def refused(self, update):
        """Mallory sends ``update``; the coordinator's decoder refuses it as out of bounds."""
        before = self.server.decoder.rejected["bounds"]
        received = self.server.core.counters["updates_received"]
        self.mallory.send("update", update, MALLORY)
        wait_until(lambda: self.server.decoder.rejected["bounds"] == before + 1, timeout_s=10,
                   what="Mallory's frame refused at decoding (bounds)")
        assert self.server.core.counters["updates_received"] == received

    def accepted(self, update):
        """Mallory sends ``update``; it must be aggregated."""
        outcome = self.verdict(self.mallory, update)
        assert outcome == "aggregated", "Mallory's in-range update %s: %s" % (outcome, self.server.counters())

    # ---- the end --------------------------------------------------------------------------------
    def finish(self):
        """Held-out accuracy and counters now, then stop everything and read the metrics."""
        self.final_accuracy = self.server.evaluator.evaluate(self.server.core.model)[0]
        self.final_counters = self.server.counters()

    def close(self):
        for dev in self.devices + ([self.mallory] if self.mallory else []):
            dev.close()
        self.server.stop()
        self.records = read_metrics(self.server.run_dir / "metrics.jsonl")


def play(broker, tmp_path, name, attack, plugins, rounds=ROUNDS, more=None, **over):
    """Three honest devices take ``rounds`` turns each on a coordinator running ``plugins``; after
    every round ``attack(fleet, rnd)`` plays Mallory (None: a clean run), and ``more(fleet, rnd)``
    says whether to go on past ``rounds``. The stopped fleet, with its accuracy and records."""
    fleet = Fleet(broker, tmp_path, name, attack is not None, plugins=plugins, **over)
    try:
        rnd = 0
        while rnd < rounds or (more is not None and more(fleet, rnd)):
            for k in range(HONEST):
                fleet.turns.append((rnd, k) + fleet.turn(k))
            if attack is not None:
                attack(fleet, rnd)
            rnd += 1
        fleet.finish()
    finally:
        fleet.close()
    return fleet


def updates_of(records, device):
    return [r for r in records if r.get("event") == "update" and r.get("device") == device]


def honest_and_whole(run):
    """No honest round diverged (none was dropped or retried) and every honest update counted."""
    for agent in run.agents:
        assert agent.divergence.total == 0, (agent.device_id, agent.divergence.total)
    refused = [(rnd, k) for rnd, k, _, _, aggregated, _ in run.turns if not aggregated]
    assert not refused, ("honest updates not aggregated (round, device)", refused)


def within_two_points(clean, attacked, what):
    """The issue's criterion (and that the clean fleet learns the task at all)."""
    assert clean.final_accuracy > 0.9, (what, clean.final_accuracy)
    assert abs(attacked.final_accuracy - clean.final_accuracy) <= POINTS, \
        (what, clean.final_accuracy, attacked.final_accuracy)


# ---- 1. FedCurv: a forged Fisher diagonal ------------------------------------------------------

FEDCURV = {"fedcurv": {"fisher_samples": 8}}


def fedcurv_attack(fleet, rnd):
    """An update equal to the global model carrying a diagonal of 1e30 (refused), then one at the
    declared maximum (admitted: it changes no weight); what it counts for in U afterwards."""
    base = fleet.newest()
    fleet.refused(fleet.forge(base, extras={CurvatureDiagonal.KIND: CurvatureDiagonal(make_tensors(SPEC, 1e30))}))
    fleet.accepted(fleet.forge(base, extras={
        CurvatureDiagonal.KIND: CurvatureDiagonal(make_tensors(SPEC, FISHER_DIAGONAL.hi))}))
    sums = fleet.server.core.plugin("fedcurv").sums
    honest = [total(sums.contribution(a.device_id)[0]) for a in fleet.agents]
    terms = fleet.newest().extras[CurvatureTerms.KIND]     # the U the devices train with now
    arrays = list(terms.U.values()) + list(terms.V.values())
    fleet.noted.append(dict(scale=sums.scale(MALLORY), honest=honest, U=total(terms.U),
                            finite=all(np.isfinite(a).all() for a in arrays)))


def test_a_forged_fedcurv_diagonal_is_refused_or_capped_and_the_fleet_trains_on(broker, tmp_path):
    clean = play(broker, tmp_path, "fc-clean", None, FEDCURV)
    attacked = play(broker, tmp_path, "fc-attacked", fedcurv_attack, FEDCURV)
    assert attacked.final_counters["rejected_bounds"] == ROUNDS            # every 1e30 diagonal
    assert len(updates_of(attacked.records, MALLORY)) == ROUNDS            # every in-range one counted
    for note in attacked.noted:
        # Mallory's diagonal (1e4 on each of 723 weights) counts for 4x the honest median total...
        assert note["scale"] < 1, note
        expected = sum(note["honest"]) + FedCurvConfig().max_peer_multiple * float(np.median(note["honest"]))
        # ...so the U the devices get is the honest sum plus that: Mallory holds at most 4/7 of it.
        assert note["U"] == pytest.approx(expected, rel=1e-3), note
        assert note["finite"], note
    # Every honest round trained (no NaN, no diverged round) and moved the model.
    honest_and_whole(attacked)
    for rnd, k, model, update, _, _ in attacked.turns:
        moved = norm({n: update.tensors[n] - model.tensors[n] for n in model.tensors})
        assert np.isfinite(moved) and moved > 1e-4, (rnd, k, moved)
    within_two_points(clean, attacked, "fedcurv")


# ---- 2. SFedPO: a forged availability ----------------------------------------------------------

SFEDPO = {"sfedpo": {}}
SFEDPO_ROUNDS = 24


def sfedpo_attack(fleet, rnd):
    """From AFTER_WARMUP on, the sign-flipped model claiming q_n = 1e-9 (refused), then the same
    claiming the smallest q_n the protocol admits."""
    if rnd < AFTER_WARMUP:
        return
    base = fleet.newest()
    fleet.refused(fleet.forge(base, tensors=negated(base), extras={
        SfedpoReport.KIND: SfedpoReport(score=0.0, availability=1e-9)}))
    fleet.accepted(fleet.forge(base, tensors=negated(base), extras={
        SfedpoReport.KIND: SfedpoReport(score=0.0, availability=MIN_AVAILABILITY)}))


@pytest.fixture(scope="module")
def sfedpo_runs(broker, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("sfedpo")
    return (play(broker, tmp_path, "sf-clean", None, SFEDPO, rounds=SFEDPO_ROUNDS),
            play(broker, tmp_path, "sf-attacked", sfedpo_attack, SFEDPO, rounds=SFEDPO_ROUNDS))


def test_a_forged_sfedpo_availability_buys_at_most_max_factor(sfedpo_runs):
    clean, attacked = sfedpo_runs
    attacks = SFEDPO_ROUNDS - AFTER_WARMUP
    assert attacked.final_counters["rejected_bounds"] == attacks            # every q_n = 1e-9
    forged = updates_of(attacked.records, MALLORY)
    assert len(forged) == attacks and forged[0].get("clipped"), forged[:2]    # bounded by admission
    factors = [r["saw_factor"] for r in forged]
    max_factor = SfedpoConfig().max_factor
    assert all(1.0 < f <= max_factor + 1e-6 for f in factors), factors    # boosted, but capped
    for agent in attacked.agents:       # the honest devices keep their weight (0.02 before)
        for run in (clean, attacked):
            honest = [r["saw_factor"] for r in updates_of(run.records, agent.device_id)]
            assert len(honest) == SFEDPO_ROUNDS and all(0.9 <= f <= 1.1 for f in honest), (agent.device_id, honest)
    honest_and_whole(attacked)


def test_a_forged_sfedpo_availability_leaves_accuracy_where_an_honest_run_has_it(sfedpo_runs):
    within_two_points(*sfedpo_runs, "sfedpo")


# ---- 3. Flood: one device, bounded updates, as fast as it can ----------------------------------

#: Honest devices send one update per PACE_S each and claim rounds that long, within admission's
#: default 2 updates/s (boards here train a round in 0.2 s to minutes; the test must stay short).
PACE_S = 0.6
FLOOD_PER_S = 20.0
FLOOD_S = 5.0
#: Admission's defaults: 2 updates/s after a burst of 4.
RATE, BURST = AdmissionConfig().max_updates_per_s, AdmissionConfig().rate_burst


class Flood:
    """Mallory sends the negated newest model ``FLOOD_PER_S`` times a second for ``FLOOD_S``."""

    def __init__(self, fleet):
        self.fleet, self.sent, self.started, self.stopped = fleet, 0, None, None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        self.started = time.monotonic()
        try:
            while time.monotonic() - self.started < FLOOD_S:
                base = self.fleet.mallory.model
                self.fleet.mallory.send("update", encode(self.fleet.forge(base, tensors=negated(base))), MALLORY)
                self.sent += 1
                time.sleep(1.0 / FLOOD_PER_S)
        finally:
            self.stopped = time.monotonic()


def paced_round(fleet, last_sent):
    """Each honest device trains from the newest model it holds and sends, no sooner than PACE_S
    after its previous update; each update's verdict (from metrics.jsonl) goes to ``fleet.log`` as
    ``(device, sent at, outcome, reason)``."""
    path = fleet.server.run_dir / "metrics.jsonl"
    for k, (agent, dev) in enumerate(zip(fleet.agents, fleet.devices)):
        agent.on_global_model(dev.model)
        update = agent.train_round()
        update = agent.complete_round(update, RoundMeasurement({}, PACE_S / max(1, update.num_samples)))
        time.sleep(max(0.0, last_sent.get(k, 0.0) + PACE_S - time.monotonic()))
        last_sent[k] = time.monotonic()
        dev.send("update", update, agent.device_id)
        found = []

        def recorded():
            found[:] = [r for r in read_metrics(path, events=("update",)) if r.get("update_id") == update.update_id]
            return found
        wait_until(recorded, timeout_s=10, what="the record of %s's update" % agent.device_id)
        fleet.log.append((agent.device_id, last_sent[k], found[0]["outcome"], found[0].get("reason")))


def flood_run(broker, tmp_path, name, flood_from=None, restart=True):
    """A clean run (``flood_from`` None) or one flooded from that round on, under admission's
    default rate settings; three more updates of each honest device after the flood; then, with
    ``restart``, the coordinator restarts on its state folder and each device sends two more."""
    fleet = Fleet(broker, tmp_path, name, flood_from is not None, plugins={}, admission={})
    fleet.log, fleet.flood, fleet.restarted_at = [], None, None
    last_sent = {}
    try:
        rnd = 0
        while rnd < ROUNDS or (fleet.flood is not None and (
                fleet.flood.thread.is_alive()
                or sum(1 for _, t, _, _ in fleet.log if t > fleet.flood.stopped) < 3 * HONEST)):
            if rnd == flood_from:
                fleet.flood = Flood(fleet)
            paced_round(fleet, last_sent)
            rnd += 1
        fleet.finish()
        if restart:     # on the same state folder: nothing of the flood persists as a lockout
            fleet.server.stop()
            fleet.server = coordinator(broker, tmp_path, name, plugins={}, admission={})
            fleet.restarted_at = time.monotonic()
            version = fleet.server.core.version
            wait_until(lambda: all(d.version() == version for d in fleet.devices), what="the restored model")
            for _ in range(2):
                paced_round(fleet, last_sent)
    finally:
        if fleet.flood is not None:
            fleet.flood.thread.join()
        fleet.close()
    return fleet


@pytest.fixture(scope="module")
def flood_clean(broker, tmp_path_factory):
    return flood_run(broker, tmp_path_factory.mktemp("flood"), "fl-clean")


def test_a_flood_is_held_to_its_rate_and_locks_nobody_out_before_or_after_a_restart(broker, tmp_path,
                                                                                      flood_clean):
    attacked = flood_run(broker, tmp_path, "fl-attacked", flood_from=AFTER_WARMUP)
    flood, log = attacked.flood, attacked.log
    forged = updates_of(attacked.records, MALLORY)
    assert len(forged) == flood.sent, (len(forged), flood.sent)
    rate = [r for r in forged if r.get("reason") == "rate"]
    counted = [r for r in forged if r["outcome"] != "rejected"]
    # Most of the flood is dropped: it counts at 2 updates/s after a burst of 4.
    assert len(rate) >= 0.75 * flood.sent, (len(rate), flood.sent)
    # (+2: the worker may take the last ones up to a second after Mallory sent them)
    assert len(counted) <= BURST + RATE * (flood.stopped - flood.started) + 2, len(counted)
    assert attacked.final_counters["admission_rejected_rate"] == len(rate)
    # Honest devices, paced as boards are, never hit their own limit, nor anything else.
    assert all(o == "aggregated" for _, _, o, _ in flood_clean.log + log), log
    # After the flood stops, each honest device's updates are accepted (from its third on, the
    # bound this test holds; in fact every one), and after a restart on the same state folder.
    for agent in attacked.agents:
        after = [o for d, t, o, _ in log if d == agent.device_id and t > flood.stopped]
        assert len(after) >= 3 and all(o == "aggregated" for o in after[2:]), (agent.device_id, after)
        restarted = [o for d, t, o, _ in log if d == agent.device_id and t > attacked.restarted_at]
        assert len(restarted) == 2 and all(o == "aggregated" for o in restarted), (agent.device_id, restarted)
    within_two_points(flood_clean, attacked, "flood")


def test_a_flood_during_admission_warmup_leaves_accuracy_where_an_honest_run_has_it(broker, tmp_path,
                                                                                    flood_clean):
    attacked = flood_run(broker, tmp_path, "fl-warmup", flood_from=2, restart=False)
    within_two_points(flood_clean, attacked, "flood in warm-up")


# ---- 4. ST-EWC: a forged T-FDM -----------------------------------------------------------------

#: Periods of 3 s: a period's T-FDM is in within a round or two (well under 3 s here), before the
#: next boundary would fold whatever answers it has.
STEWC = {"stewc": {"boundary": "schedule", "period_s": 3.0, "fisher_samples": 8, "fisher_wait_s": 10.0}}
STEWC_MULTIPLE = StEwcConfig().max_peer_multiple


def stewc_attack(fleet, rnd):
    """Mallory answers each period being consolidated with a T-FDM at the declared maximum from
    the declared maximum of windows (after one of 10^9 windows, refused)."""
    base = fleet.newest()
    terms = base.extras.get(PeriodTerms.KIND)
    if terms is None or terms.consolidating is None or terms.consolidating in fleet.noted:
        return
    fleet.noted.append(terms.consolidating)
    top = make_tensors(SPEC, FISHER_DIAGONAL.hi)
    fleet.refused(fleet.forge(base, extras={PeriodFisher.KIND: PeriodFisher(terms.consolidating, 10 ** 9, top)}))
    fleet.accepted(fleet.forge(base, extras={
        PeriodFisher.KIND: PeriodFisher(terms.consolidating, int(PeriodFisher.BOUNDS["samples"].hi), top)}))


def folded(fleet, rnd):
    """Go on until a period was consolidated (the schedule runs on wall time), and one round more:
    the fold's event is written with the next aggregation."""
    if fleet.server.core.plugin("stewc").sums.folded and not hasattr(fleet, "folded_at"):
        fleet.folded_at = rnd
    return rnd < 60 and rnd <= getattr(fleet, "folded_at", rnd)


@pytest.fixture(scope="module")
def stewc_runs(broker, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("stewc")
    return (play(broker, tmp_path, "st-clean", None, STEWC, more=folded),
            play(broker, tmp_path, "st-attacked", stewc_attack, STEWC, more=folded))


def first_fold(run):
    """The first ``consolidated`` event, and the honest devices' answers ``[(n, F)]`` to it."""
    events = [r for r in run.records if r.get("event") == "consolidated"]
    assert events, [r for r in run.records if r.get("event") in ("period", "consolidated")]
    answers = [u.extras[PeriodFisher.KIND] for _, _, _, u, _, _ in run.turns
               if PeriodFisher.KIND in u.extras and u.extras[PeriodFisher.KIND].period == events[0]["period"]]
    return events[0], [(float(a.samples), a.F) for a in answers]


def fold_parts(event, honest):
    """Mallory's part of P's mass at the fold and the honest answers', from the event's mean and
    the honest answers. Eq. 9: fisher_mean = (w_m m_m + sum n_k m_k) / (w_m + sum n_k), with m
    an answer's element mean and w_m = 4 x the median honest count (Mallory's 10^7 windows, capped).
    ``(Mallory's part, the honest parts, the honest counts)``."""
    n = [s for s, _ in honest]
    parts = [s * total(f) / sum(a.size for a in f.values()) for s, f in honest]
    weight = STEWC_MULTIPLE * float(np.median(n))
    return event["fisher_mean"] * (weight + sum(n)) - sum(parts), parts, n


def test_a_forged_stewc_fisher_is_refused_or_capped(stewc_runs):
    clean, attacked = stewc_runs
    event, _ = first_fold(clean)
    assert event["devices"] == HONEST and event["capped_devices"] == [], event
    event, honest = first_fold(attacked)
    assert event["devices"] == HONEST + 1 and event["capped_devices"] == [MALLORY], event
    assert len(honest) == HONEST and attacked.final_counters["rejected_bounds"] == len(attacked.noted)
    # Before the caps Mallory held 99% of P (fisher mean 0.00046 -> 9,920, 2e7 x the honest one).
    forged, parts, n = fold_parts(event, honest)
    share, ratio = forged / (forged + sum(parts)), event["fisher_mean"] / (sum(parts) / sum(n))
    assert share < 0.99 and ratio < 100, (share, ratio, event)
    honest_and_whole(attacked)
    within_two_points(clean, attacked, "stewc")


def test_a_forged_stewc_fisher_holds_at_most_its_capped_share_of_p(stewc_runs):
    _, attacked = stewc_runs
    event, honest = first_fold(attacked)
    forged, parts, n = fold_parts(event, honest)
    # The cap as documented: its part of eq. 9's numerator (samples x T-FDM mass) at most 4x the
    # median of the honest answers' parts, so at most 4 / (4 + 3 - 1) of P.
    allowed = STEWC_MULTIPLE * float(np.median(parts))
    assert forged <= allowed * (1 + 1e-3), (forged / (forged + sum(parts)), allowed / (allowed + sum(parts)))
    assert forged / (forged + sum(parts)) <= STEWC_MULTIPLE / (STEWC_MULTIPLE + HONEST - 1) + 1e-3


# ---- 5. AdaCLP: forged Fisher traces -----------------------------------------------------------

CLP = {"clp": {}}


def clp_attack(fleet, rnd):
    """A trace above the declared bound (refused), then one at it, each round."""
    base = fleet.newest()
    fleet.refused(fleet.forge(base, extras={FisherTrace.KIND: FisherTrace(FISHER_TRACE.hi * 10)}))
    fleet.accepted(fleet.forge(base, extras={FisherTrace.KIND: FisherTrace(FISHER_TRACE.hi)}))


def test_forged_fisher_traces_move_f_g_and_the_clp_flag_by_a_bounded_factor(broker, tmp_path):
    clean = play(broker, tmp_path, "clp-clean", None, CLP)
    attacked = play(broker, tmp_path, "clp-attacked", clp_attack, CLP)
    assert attacked.final_counters["rejected_bounds"] == ROUNDS
    turns = list(zip(clean.turns, attacked.turns))      # the same honest turns, in order
    # F_G, as each honest round read it, within 4x of the clean run's (a forged 1e9 made it 1e8x).
    states = [(c[2].extras[ClpState.KIND], a[2].extras[ClpState.KIND]) for c, a in turns]
    ratios = [a.fisher_global / c.fisher_global for c, a in states if c.fisher_global and a.fisher_global]
    assert len(ratios) == len(turns) - 1 and all(0.25 <= r <= 4.0 for r in ratios), ratios
    # So eq. 4 gives the honest rounds an lr within 4^ln 2 of the clean run's (a segment start
    # resets it to eta0 in either run, so compare medians), never the floor: with traces of 1e9,
    # 42 of 56 rounds trained at lr 1e-4, batch 8.
    limits, spread = ClpHparamsConfig(), ClpProbeConfig().max_peer_multiple ** math.log(2)
    lrs = [[t[5]["lr"] for t in run.turns] for run in (clean, attacked)]
    assert 1 / spread <= np.median(lrs[1]) / np.median(lrs[0]) <= spread, lrs
    assert all(t[5]["lr"] > limits.lr_min and t[5]["batch_size"] > limits.batch_min for t in attacked.turns)
    # The CLP flag is eq. 3's 1% growth test, so any change to the sequence reorders it turn by
    # turn; what one device must not do is move how much of the run the fleet spends in the CLP:
    # the honest rounds trained in it are within 9 of 36 of the clean run's.
    in_clp = [sum(s.in_clp for s in run) for run in zip(*states)]
    assert abs(in_clp[1] - in_clp[0]) <= 9, (in_clp, [(c.in_clp, a.in_clp) for c, a in states])
    honest_and_whole(attacked)
    within_two_points(clean, attacked, "clp")


# ---- 6. Sessions beside the global model: forged auxiliary marks --------------------------------

SESSIONS_BESIDE = {"sessions": {"init": "session-init", "aux_model": "beside", "change_fraction": 0.2,
                                "settle_s": 0.0, "min_session_s": 0.0, "silence_s": 0.0,
                                "aux_wait_s": 600.0}}


def test_forged_session_aux_marks_are_refused_or_held_to_one_capped_answer_and_never_reach_the_model(
        broker, tmp_path):
    """Mallory marks updates as answers to the auxiliary round: out of range they are refused at
    decoding; in range a flood of them with a claim of 10^6 samples each gives one answer, its
    samples capped at admission's peer multiple, and none of them ever reaches the fleet's model,
    while the honest devices answer the round and the fleet trains on."""
    fleet = Fleet(broker, tmp_path, "sessions-beside", True, plugins=SESSIONS_BESIDE, strategy="fedasync")
    plugin = fleet.server.core.plugin("sessions")
    core = fleet.server.core

    def honest(k):
        """Device k trains from the newest model it holds and sends; waits until it is handled."""
        dev, agent = fleet.devices[k], fleet.agents[k]
        assert wait_for(lambda: dev.version() == core.version, timeout_s=10)
        agent.on_global_model(dev.model)
        update = agent.train_round()
        done = updates_handled(core)
        dev.send("update", update, agent.device_id)
        wait_until(lambda: updates_handled(core) == done + 1, timeout_s=10,
                   what="%s's update handled" % agent.device_id)
        return update

    try:
        samples = []
        for _ in range(4):                                  # session 0, past admission's warm-up
            for k in range(HONEST):
                samples.append(honest(k).num_samples)
        cap = AdmissionConfig().samples_peer_multiple * float(np.median(samples))
        assert plugin.session == 0
        newcomer_agent = honest_agent(HONEST)
        newcomer = Client(broker, "sessions-beside-%s" % newcomer_agent.device_id)
        # A fourth device says Hello: 1 of 4 new, past change_fraction, so session 1 begins.
        newcomer.send("status", make_hello(newcomer_agent.device_id, SPEC), newcomer_agent.device_id)
        wait_until(lambda: plugin.aux_round == 1, timeout_s=10, what="session 1's auxiliary round")
        base = fleet.newest()                               # the version that announced it
        terms = base.extras["session"]
        assert terms.aux_round == 1 and terms.aux is not None
        pilot = terms.aux
        # Out of range: refused at decoding.
        for mark in (SessionAux(1, 0), SessionAux(1, 65)):
            fleet.refused(fleet.forge(base, tensors=pilot, extras={SessionAux.KIND: mark}))
        # In range, a flood: one answer, its samples capped; the model never moves for them.
        version, withheld = core.version, core.counters["withheld"]
        far = {k: a + 0.05 for k, a in pilot.items()}
        for _ in range(5):
            fleet.mallory.send("update", fleet.forge(base, tensors=far, num_samples=10 ** 6,
                                                     extras={SessionAux.KIND: SessionAux(1, 1)}), MALLORY)
        wait_until(lambda: core.counters["withheld"] + core.counters["rejected"] >= withheld + 5,
                   timeout_s=10, what="Mallory's five marked updates handled")
        assert core.version == version
        answers = plugin.aux.updates
        assert list(answers) == [MALLORY], list(answers)    # one answer for five
        assert answers[MALLORY].num_samples <= cap, (answers[MALLORY].num_samples, cap)
        # The honest devices answer the round from the auxiliary model (their agents mark it).
        for k in range(HONEST):
            update = honest(k)
            assert update.extras[SessionAux.KIND] == SessionAux(1, 1), update.extras
        assert core.version == version
        newcomer_agent.on_global_model(fleet.newest())      # the fourth honest answer
        update = newcomer_agent.train_round()
        done = updates_handled(core)
        newcomer.send("update", update, newcomer_agent.device_id)
        wait_until(lambda: updates_handled(core) == done + 1, timeout_s=10, what="the newcomer's answer")
        wait_until(lambda: plugin.aux is None, timeout_s=10, what="the auxiliary round closed")
        assert plugin.gradient is not None and core.version == version
        # The fleet trains on: its own updates reach the model again.
        for k in range(HONEST):
            honest(k)
        assert core.version == version + HONEST
        newcomer.close()
    finally:
        fleet.close()
    records = [r for r in fleet.records if r.get("event") == "update" and r.get("device") == MALLORY]
    assert records and all(not r["aggregated"] for r in records)
    marked = [r for r in records if r.get("aux_round") == 1]
    assert marked and all(r["num_samples"] <= cap for r in marked), (marked, cap)
