"""The command-line logging set-up: one handler, and it follows sys.stdout when stdout is replaced
(a background thread logging after a test's capture closed once wrote to a closed file)."""
import io
import logging
import sys

import pytest

from streamfl.errors import ConfigError
from streamfl.logs import setup_logging


@pytest.fixture
def root_handlers():
    root = logging.getLogger()
    kept, level = list(root.handlers), root.level
    yield root
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in kept:
        root.addHandler(handler)
    root.setLevel(level)


def test_the_default_handler_writes_to_the_stdout_of_the_moment(root_handlers, monkeypatch):
    first = io.StringIO()
    monkeypatch.setattr(sys, "stdout", first)
    setup_logging("INFO")
    assert len(root_handlers.handlers) == 1
    first.close()  # the stdout logging was set up with is gone
    second = io.StringIO()
    monkeypatch.setattr(sys, "stdout", second)
    logging.getLogger("logs-test").info("still heard")
    assert "still heard" in second.getvalue()


def test_an_explicit_stream_is_kept_and_a_bad_level_refused(root_handlers):
    out = io.StringIO()
    setup_logging("WARNING", stream=out)
    logging.getLogger("logs-test").info("quiet")
    logging.getLogger("logs-test").warning("loud")
    assert "loud" in out.getvalue() and "quiet" not in out.getvalue()
    with pytest.raises(ConfigError, match="log-level"):
        setup_logging("chatty")
