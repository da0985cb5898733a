"""Waiting in tests for what another thread or process does: poll, never sleep a fixed time."""
import time
from typing import Any, Callable


def wait_for(predicate: Callable[[], Any], timeout_s: float = 10.0, poll_s: float = 0.01) -> bool:
    """Poll ``predicate`` until it is truthy or ``timeout_s`` passed; its last answer, as a bool."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return bool(predicate())


def wait_until(predicate: Callable[[], Any], timeout_s: float = 20.0, what: str = "condition") -> None:
    """``wait_for`` that fails the test with ``what`` on timeout."""
    if not wait_for(predicate, timeout_s, poll_s=0.02):
        raise AssertionError("timed out waiting for %s" % what)


#: A coordinator core's counters of an update's outcome: each update the worker has finished with
#: moves exactly one (``updates_received`` moves as it starts one, before the outcome exists).
OUTCOME_COUNTERS = ("aggregated", "withheld", "rejected", "duplicates", "stale_dropped")


def updates_handled(core: Any) -> int:
    """Updates a ``CoordinatorCore`` has finished with: wait on this, not ``updates_received``."""
    return sum(core.counters[k] for k in OUTCOME_COUNTERS)
