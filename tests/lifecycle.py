"""Fixture bodies for things a test starts: each one made is started, and stopped at teardown."""
from typing import Any, Callable, Iterator


def started_by(factory: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """Yield a function that builds with ``factory``, starts the result and returns it; every one
    built is stopped when the fixture ends (``yield from started_by(...)`` in a fixture)."""
    made = []

    def start(*args: Any, **kwargs: Any) -> Any:
        thing = factory(*args, **kwargs)
        thing.start()
        made.append(thing)
        return thing

    yield start
    for thing in made:
        thing.stop()
