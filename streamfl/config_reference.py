"""The configuration reference (docs/configuration.md), generated from the config dataclasses so it cannot drift.

``render()`` walks ``AgentConfig`` (streamfl-agent's YAML) and ``CoordinatorConfig``
(streamfl-coordinator's YAML), each nested section, and every shipped method plug-in's settings
dataclass (``plugins: {<name>: {...}}`` on either side): per key its dotted YAML path, type,
default, declared range (``streamfl.config.bounded``) and description. A description is the
``#:`` comment block just above the field in its class's source, else the ``key: ...`` mention
of it in that class's docstring. ``python -m streamfl.config_reference > docs/configuration.md``
regenerates the page (``make docs-config``); ``--check FILE`` exits 1 when FILE differs.
"""
import argparse
import ast
import dataclasses
import inspect
import re
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Type

from streamfl.config import INFINITE, field_range

#: The page's first line: what made it and how to make it again.
HEADER = ("<!-- Generated from the config dataclasses by `python -m streamfl.config_reference`; "
          "do not edit: run `make docs-config` to regenerate. -->")

_NONE_TYPE = type(None)


def programs() -> List[Tuple[str, str, Type]]:
    """``(program, YAML file, config class)`` of the two programs, agent first."""
    from streamfl.agent.config import AgentConfig
    from streamfl.coordinator.config import CoordinatorConfig
    return [("streamfl-agent", "agent.yaml", AgentConfig),
            ("streamfl-coordinator", "coordinator.yaml", CoordinatorConfig)]


def plugin_configs(side: str) -> List[Tuple[str, Type, Type]]:
    """``(YAML name, plug-in class, settings dataclass)`` of the shipped methods' plug-ins on
    ``side`` ("coordinator" or "agent"), in calling order. Methods registered from elsewhere
    (entry points, tests) are left out, so the page is the same on every install."""
    from streamfl import methods
    found = methods.coordinator_plugins() if side == "coordinator" else methods.agent_plugins()
    return [(getattr(cls, "name", None) or name, cls, cls.Config)
            for name, cls in found.items() if name in methods.BUILTIN]


def _fields(cls: Type) -> List["dataclasses.Field"]:
    """The fields a YAML file can set (``init=False`` ones are derived on load)."""
    return [f for f in dataclasses.fields(cls) if f.init]


def _dataclass_of(tp: Any) -> Optional[Type]:
    """The dataclass ``tp`` is (or Optional of), else None."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp
    if getattr(tp, "__origin__", None) is typing.Union:
        inner = [a for a in tp.__args__ if a is not _NONE_TYPE]
        if len(inner) == 1:
            return _dataclass_of(inner[0])
    return None


# -- descriptions ---------------------------------------------------------------------------------

def _owner(cls: Type, name: str) -> Type:
    """The class in ``cls``'s MRO whose body declares field ``name``."""
    for klass in cls.__mro__:
        if name in klass.__dict__.get("__annotations__", {}):
            return klass
    return cls


def _comment_blocks(cls: Type) -> Dict[str, str]:
    """``{field: text}`` of the ``#:`` comment lines just above each field in ``cls``'s own body."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    tree = ast.parse(textwrap.dedent("\n".join(lines)))
    body = next((node.body for node in tree.body if isinstance(node, ast.ClassDef)), [])
    out = {}
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        i = node.lineno - 2  # the line above the field (linenos count from 1)
        block: List[str] = []
        while i >= 0 and lines[i].strip().startswith("#:"):
            block.insert(0, lines[i].strip()[2:].strip())
            i -= 1
        if block:
            out[node.target.id] = " ".join(part for part in block if part)
    return out


def _docstring_mentions(cls: Type, names: Sequence[str]) -> Dict[str, str]:
    """``{field: text}`` from ``cls``'s own docstring, whose clauses read ``key: text`` (or
    ``key = value: text``, or ``key_a, key_b: text``), each at a line's start or after ``; ``."""
    doc = cls.__dict__.get("__doc__")
    if not doc or not names:
        return {}
    doc = inspect.cleandoc(doc)
    key = "(?:``)?(?:%s)(?:``)?" % "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    clause = re.compile(r"(?:^|(?<=\n)|(?<=; ))[ \t]*(%s(?:,[ \t]*%s)*)(?:[ \t]*=[ \t]*([^:\n]+))?:\s"
                        % (key, key))
    matches = list(clause.finditer(doc))
    out: Dict[str, str] = {}
    for j, match in enumerate(matches):
        end = matches[j + 1].start() if j + 1 < len(matches) else len(doc)
        text = doc[match.end():end]
        text = text.split("\n\n", 1)[0]  # a paragraph ends a clause
        text = " ".join(text.split()).rstrip(";").strip()
        if match.group(2):
            text = "Default %s: %s" % (match.group(2).strip(), text)
        text = text[:1].upper() + text[1:]
        for name in re.split(r",[ \t]*", match.group(1)):
            out.setdefault(name.strip("`"), text)
    return out


def descriptions(cls: Type) -> Dict[str, str]:
    """``{field: description}`` of every settable field of ``cls`` ("" where its source says nothing)."""
    by_owner: Dict[Type, List[str]] = {}
    for f in _fields(cls):
        by_owner.setdefault(_owner(cls, f.name), []).append(f.name)
    out: Dict[str, str] = {}
    for owner, names in by_owner.items():
        comments = _comment_blocks(owner)
        mentions = _docstring_mentions(owner, names)
        for name in names:
            out[name] = comments.get(name) or mentions.get(name, "")
    return out


# -- cells ----------------------------------------------------------------------------------------

def type_name(tp: Any) -> str:
    """A field's annotation in YAML words (``int``, ``float or null``, ``list of str``, ``mapping``)."""
    origin = getattr(tp, "__origin__", None)
    args = getattr(tp, "__args__", ()) or ()
    if origin is typing.Union:
        inner = [type_name(a) for a in args if a is not _NONE_TYPE]
        return " or ".join(inner + (["null"] if _NONE_TYPE in args else []))
    if _dataclass_of(tp) is not None:
        return "section"
    if origin in (tuple, list, frozenset, set):
        item = [a for a in args if a is not Ellipsis]
        return "list of %s" % type_name(item[0]) if len(set(item)) == 1 else "list"
    if origin is dict or tp is dict:
        return "mapping"
    if tp is Path:
        return "path"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _yaml_value(value: Any) -> str:
    """``value`` as it would be written in the YAML file."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (int, str)):
        return str(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (tuple, list, frozenset, set)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return "[%s]" % ", ".join(_yaml_value(v) for v in items)
    if isinstance(value, dict):
        return "{%s}" % ", ".join("%s: %s" % (k, _yaml_value(v)) for k, v in sorted(value.items(), key=repr))
    return repr(value)


def default_text(f: "dataclasses.Field") -> str:
    """The field's default as a YAML value (a nested section: "(section)")."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        if dataclasses.is_dataclass(f.default_factory):
            return "(section)"
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "(required)"
    return "`%s`" % _yaml_value(value)


def range_text(f: "dataclasses.Field") -> str:
    """The declared range (``[lo, hi]``, an open end in round brackets), and whether +-inf passes."""
    rng = field_range(f)
    parts = [str(rng)] if rng is not None else []
    if f.metadata.get(INFINITE):
        parts.append("+-inf allowed")
    return "; ".join(parts)


def _cell(text: str) -> str:
    """``text`` made safe for one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


# -- the page -------------------------------------------------------------------------------------

def _table(cls: Type, prefix: str) -> List[str]:
    """The table of ``cls``'s keys, each named ``prefix`` + key."""
    fields = _fields(cls)
    if not fields:
        return ["No settings.", ""]
    hints = typing.get_type_hints(cls)
    about = descriptions(cls)
    rows = ["| key | type | default | range | description |", "|---|---|---|---|---|"]
    for f in fields:
        text = about[f.name]
        nested = _dataclass_of(hints[f.name])
        if nested is not None:
            text = "%s (keys under `%s.`, below)" % (text or _summary(nested) or "A section", prefix + f.name)
        rows.append("| `%s` | %s | %s | %s | %s |" % (
            prefix + f.name, _cell(type_name(hints[f.name])), _cell(default_text(f)),
            _cell(range_text(f)), _cell(text)))
    return rows + [""]


def _summary(cls: Type) -> str:
    """The first paragraph of ``cls``'s docstring, on one line ("" if it has none, or if it is
    the keys' descriptions, which the table already shows)."""
    doc = cls.__dict__.get("__doc__")
    if not doc:
        return ""
    first = " ".join(inspect.cleandoc(doc).split("\n\n", 1)[0].split())
    names = [f.name for f in _fields(cls)]
    if any(first.startswith(n + ":") or first.startswith("``%s``:" % n) for n in names):
        return ""
    return first


def _sections(cls: Type, prefix: str, program: str) -> Iterator[List[str]]:
    """The section of ``cls`` (keys ``prefix``...), then one per nested dataclass, depth first."""
    title = "`%s`" % prefix.rstrip(".") if prefix else "top-level keys"
    lines = ["### %s: %s" % (program, title), ""]
    summary = _summary(cls)
    if summary:
        lines += [summary, ""]
    lines += ["Settings class: `%s.%s`." % (cls.__module__, cls.__qualname__), ""]
    yield lines + _table(cls, prefix)
    hints = typing.get_type_hints(cls)
    for f in _fields(cls):
        nested = _dataclass_of(hints[f.name])
        if nested is not None:
            key = prefix + f.name
            yield from _sections(nested, key + ".", program)


def render() -> str:
    """The whole Markdown page (deterministic: declaration and calling order throughout)."""
    out = [HEADER, "", "# Configuration reference", "",
           "Every key each program's YAML file accepts, with its type, default, accepted range and "
           "meaning. Every key is optional; a number outside its range, a NaN or an infinity (unless "
           "the range says +-inf allowed), an unknown key and a wrong type are errors naming the key "
           "(exit code 2). A range reads `[lo, hi]`, a round bracket marking an end that is "
           "excluded; a `list of` key's range holds for each item. Command-line flags override the "
           "file.", ""]
    for program, filename, cls in programs():
        out += ["## %s (`%s`)" % (program, filename), ""]
        for lines in _sections(cls, "", program):
            out += lines
    for side, program in (("coordinator", "streamfl-coordinator"), ("agent", "streamfl-agent")):
        out += ["## Method plug-ins, %s side" % side, "",
                "Keys under `plugins: {<name>: {...}}` in %s's YAML; a plug-in not named there takes "
                "its defaults." % program, ""]
        for name, plugin, config in plugin_configs(side):
            out += ["### %s: `plugins.%s`" % (program, name), ""]
            summary = _summary(config)
            if summary:
                out += [summary, ""]
            out += ["Plug-in `%s.%s`, settings class `%s.%s`." % (
                plugin.__module__, plugin.__qualname__, config.__module__, config.__qualname__), ""]
            out += _table(config, "plugins.%s." % name)
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print the page, or with ``--check FILE`` exit 1 (saying how to fix it) if FILE differs."""
    parser = argparse.ArgumentParser(prog="python -m streamfl.config_reference", description=__doc__.split("\n")[0])
    parser.add_argument("--check", metavar="FILE", type=Path,
                        help="compare FILE with the generated page instead of printing it")
    args = parser.parse_args(argv)
    page = render()
    if args.check is None:
        sys.stdout.write(page)
        return 0
    try:
        current = args.check.read_text(encoding="utf-8")
    except OSError as exc:
        print("%s: cannot read: %s; run `make docs-config`" % (args.check, exc.strerror or exc), file=sys.stderr)
        return 1
    if current != page:
        print("%s is out of date with the config dataclasses; run `make docs-config` to regenerate it"
              % args.check, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
