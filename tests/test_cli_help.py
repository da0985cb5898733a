"""``streamfl``, its sub-commands, ``streamfl-agent`` (and ``dvfs``) and ``streamfl-coordinator``
describe themselves in plain words: no reST or Markdown from docstrings leaks into --help."""
import argparse
import re

import pytest

from streamfl import cli as streamfl_cli
from streamfl.agent import cli as agent_cli
from streamfl.agent import dvfs_cli
from streamfl.coordinator import cli as coordinator_cli

#: ``literal``, :role:`x`, **bold**, `link <url>`_, a reST directive.
MARKUP = re.compile(r"``|:[a-z]+:`|\*\*|`_|^\.\. ", re.MULTILINE)


def parsers():
    """Every top-level parser and every sub-command parser under it, by name."""
    out = {}
    for name, parser in (("streamfl", streamfl_cli.build_parser()),
                         ("streamfl-agent", agent_cli.build_parser()),
                         ("streamfl-agent dvfs", dvfs_cli.build_parser()),
                         ("streamfl-coordinator", coordinator_cli.build_parser())):
        out[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    out["%s %s" % (name, sub_name)] = sub
    return out


def test_every_sub_command_is_covered():
    assert {"streamfl demo", "streamfl sim", "streamfl report"} <= set(parsers())


@pytest.mark.parametrize("name", sorted(parsers()))
def test_help_has_no_markup(name):
    text = parsers()[name].format_help()
    assert not MARKUP.search(text), "%s --help shows markup: %r" % (name, MARKUP.findall(text))


@pytest.mark.parametrize("name", ["streamfl demo", "streamfl sim", "streamfl report"])
def test_sub_commands_describe_themselves(name):
    parser = parsers()[name]
    assert parser.description and parser.description[0].isupper()
