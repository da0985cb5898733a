"""The agent's warning that no global model comes: a board started on the wrong fleet or broker, or
whose coordinator is down, would otherwise wait silently forever.

The first WARNING comes ``warn_after_s`` after the start or the last model, then again every
``REPEAT_FACTOR`` times as long while none comes (every 10 minutes at the default 60 s): visible to
anyone who looks at the journal, without filling it.
"""
import logging

log = logging.getLogger(__name__)

#: Repeat the warning every this many ``warn_after_s`` while no model comes.
REPEAT_FACTOR = 10.0


class ModelWait:
    """Counts the seconds since the last global model and says so, slowly, naming the topic."""

    def __init__(self, warn_after_s: float, topic: str, fleet: str, now: float):
        self.warn_after_s = float(warn_after_s)
        self.topic = topic
        self.fleet = fleet
        self.warnings = 0
        self._models = 0
        self._since_s = now
        self._next_s = now + self.warn_after_s

    def check(self, models_received: int, now: float, waiting: bool = True) -> bool:
        """Note the models received so far; True when this call logged the warning. ``waiting``:
        the agent asks for a model now (agent/model_feed.py); the time it does not ask is not
        counted, since a board that fetches one model per round gets none between rounds."""
        if self.warn_after_s <= 0:
            return False
        if models_received != self._models or not waiting:
            self._models = models_received
            self._since_s = now
            self._next_s = now + self.warn_after_s
            return False
        if now < self._next_s:
            return False
        self._next_s = now + self.warn_after_s * REPEAT_FACTOR
        self.warnings += 1
        log.warning("%s for %.0f s: waiting on topic %s (fleet %r); is a coordinator running for "
                    "this fleet on this broker? (next reminder in %.0f s)",
                    "no global model yet" if self._models == 0 else "no new global model",
                    now - self._since_s, self.topic, self.fleet,
                    self.warn_after_s * REPEAT_FACTOR)
        return True
