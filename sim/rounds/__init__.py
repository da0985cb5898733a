"""Round runners: where a simulated device's SGD runs (in this process, worker processes, Ray actors)."""
from typing import Optional

from streamfl.errors import ConfigError
from streamfl.sim.rounds.base import RoundRunner
from streamfl.sim.rounds.inline import InlineRounds

EXECUTORS = ("local", "ray")


def check_workers(workers: Optional[int], executor: str = "local") -> None:
    """ConfigError unless ``workers`` is None or a whole number >= 1 and ``executor`` is known."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError("--workers must be a whole number of at least 1, got %r" % (workers,))
    if executor not in EXECUTORS:
        raise ConfigError("unknown executor %r (choose one of %s)" % (executor, ", ".join(EXECUTORS)))


def make_rounds(workers: Optional[int], executor: str = "local",
                ray_address: Optional[str] = None) -> RoundRunner:
    """The round runner ``--workers``/``--executor`` name: in this process without ``workers``,
    else ``workers`` processes here (``local``) or Ray actors (``ray``); ConfigError for a wrong
    choice, before any run starts."""
    check_workers(workers, executor)
    if workers is None:
        return InlineRounds()
    if executor == "local":
        from streamfl.sim.rounds.processes import ProcessRounds
        return ProcessRounds(workers)
    from streamfl.sim.rounds.ray_actors import RayRounds
    return RayRounds(workers, ray_address)


__all__ = ["InlineRounds", "RoundRunner", "check_workers", "make_rounds"]
