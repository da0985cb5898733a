"""docs/configuration.md is what streamfl.config_reference renders now, and it names every key."""
import dataclasses
import typing
from pathlib import Path

import pytest

from streamfl import methods
from streamfl.agent.config import AgentConfig
from streamfl.config_reference import main, render
from streamfl.coordinator.config import CoordinatorConfig

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


@pytest.fixture(scope="module")
def page() -> str:
    return render()


def _keys(cls, prefix=""):
    """Every dotted YAML key of config dataclass ``cls``, nested sections walked into."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:  # derived on load, not a key
            continue
        yield prefix + f.name
        tp = hints[f.name]
        inner = [a for a in getattr(tp, "__args__", ()) or () if a is not type(None)]
        nested = tp if dataclasses.is_dataclass(tp) else (inner[0] if len(inner) == 1 else None)
        if dataclasses.is_dataclass(nested):
            yield from _keys(nested, prefix + f.name + ".")


def _all_keys():
    """``(heading, dotted key)`` of both programs' keys and every shipped plug-in's: the key
    belongs in the part of the page that starts at that heading."""
    for program, cls in (("streamfl-agent", AgentConfig), ("streamfl-coordinator", CoordinatorConfig)):
        for key in _keys(cls):
            yield "## %s (" % program, key
    for program, found in (("streamfl-coordinator", methods.coordinator_plugins()),
                           ("streamfl-agent", methods.agent_plugins())):
        for name, plugin in found.items():
            if name in methods.BUILTIN:
                for key in _keys(plugin.Config, "plugins.%s." % plugin.name):
                    yield "### %s: `plugins.%s`" % (program, plugin.name), key


def _part(page, heading):
    """The page from the line starting with ``heading`` to the next heading of its level."""
    level = heading.split(" ", 1)[0] + " "
    lines = page.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
    if start is None:
        return ""
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(level)), len(lines))
    return "\n".join(lines[start:end])


def test_committed_page_is_current(page):
    assert PAGE.is_file(), "docs/configuration.md is missing: run make docs-config"
    assert PAGE.read_text(encoding="utf-8") == page, (
        "docs/configuration.md differs from the config dataclasses: run make docs-config")


def test_every_key_is_in_the_page(page):
    missing = ["%s: %s" % (heading, key) for heading, key in _all_keys()
               if "| `%s` |" % key not in _part(page, heading)]
    assert not missing, "keys missing from the configuration reference: %s" % ", ".join(missing)


def test_render_is_deterministic(page):
    assert render() == page


def test_check_flag(tmp_path, page, capsys):
    same = tmp_path / "same.md"
    same.write_text(page, encoding="utf-8")
    assert main(["--check", str(same)]) == 0
    stale = tmp_path / "stale.md"
    stale.write_text(page.replace("| `lr` |", "| `learning_rate` |"), encoding="utf-8")
    assert main(["--check", str(stale)]) == 1
    assert "make docs-config" in capsys.readouterr().err
