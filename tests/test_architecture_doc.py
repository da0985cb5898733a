"""docs/architecture.md stays true of the code: its folder table lists exactly the packages
setup.py installs, its import rules hold on the import graph, and every repository path it names
exists."""
import re
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

from source_tree import ROOT, packages, source_files
from streamfl import methods
from test_import_graph import MODULES, _imports

DOC = ROOT / "docs" / "architecture.md"
TEXT = DOC.read_text(encoding="utf-8")

#: The folder table's header row; its rows are ``| `folder/` | `import name` | role |``.
TABLE_HEADER = "| folder | import name | role |"
ROW = re.compile(r"^\|\s*`([^`]+)/`\s*\|\s*`([^`]+)`\s*\|")
#: ``A !-> B`` lines of the doc's ```imports block.
RULE = re.compile(r"^(\S+)\s+!->\s+(\S+)$")


def folder_table() -> Dict[str, str]:
    """``{folder: import name}`` from the doc's folder table."""
    lines = TEXT.splitlines()
    start = lines.index(TABLE_HEADER)
    out = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        match = ROW.match(line)
        assert match, "folder table row not of the form | `folder/` | `name` | role |: %r" % line
        assert match.group(1) not in out, "folder %s listed twice" % match.group(1)
        out[match.group(1)] = match.group(2)
    return out


def test_the_folder_table_lists_exactly_the_installed_packages():
    listed = folder_table()
    installed = {str(folder.relative_to(ROOT)): name for name, folder in packages().items()}
    assert sorted(set(installed) - set(listed)) == [], "packages the table misses"
    assert sorted(set(listed) - set(installed)) == [], "table rows that are no package"
    assert listed == installed


def rule_lines() -> List[str]:
    blocks = re.findall(r"^```imports\n(.*?)^```", TEXT, re.S | re.M)
    assert len(blocks) == 1, "docs/architecture.md needs one ```imports block"
    return [line.strip() for line in blocks[0].splitlines()
            if line.strip() and not line.strip().startswith("#")]


def expand(line: str) -> Iterator[Tuple[str, str]]:
    """The (A, B) pairs of one rule: ``<name>`` is each shipped method (``BUILTIN``), ``<other>``
    each shipped method but the one ``<name>`` stands for."""
    match = RULE.match(line)
    assert match, "not an import rule (A !-> B): %r" % line
    source, target = match.groups()
    names = methods.BUILTIN if "<name>" in line else ("",)
    for name in names:
        others = [o for o in methods.BUILTIN if o != name] if "<other>" in line else [""]
        for other in others:
            yield (source.replace("<name>", name).replace("<other>", other),
                   target.replace("<name>", name).replace("<other>", other))


def under(prefix: str, names) -> Set[str]:
    """``prefix`` and every module below it."""
    return {n for n in names if n == prefix or n.startswith(prefix + ".")}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def reached(module: str) -> Set[str]:
    """Every streamfl module ``module`` imports, directly or through others."""
    seen: Set[str] = set()
    todo = [module]
    while todo:
        for target in GRAPH[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def offenders(source: str, target: str) -> List[str]:
    return sorted("%s -> %s" % (s, t) for s in under(source, MODULES)
                  for t in reached(s) if t in under(target, MODULES) and t != s)


@pytest.mark.parametrize("line", rule_lines())
def test_import_rule_holds(line):
    pairs = list(expand(line))
    assert any(under(source, MODULES) for source, _ in pairs), "%r: no module matches its left side" % line
    assert all(under(target, MODULES) for _, target in pairs), "%r: a right side matches no module" % line
    found = [o for source, target in pairs for o in offenders(source, target)]
    assert found == [], "%s is false" % line


def test_the_rule_checker_sees_transitive_imports():
    # The core reaches the methods' registry only through its plug-in package.
    assert "streamfl.coordinator.plugins" in GRAPH["streamfl.coordinator.core"]
    assert "streamfl.methods" not in GRAPH["streamfl.coordinator.core"]
    assert offenders("streamfl.coordinator.core", "streamfl.methods") != []
    assert list(expand("streamfl.methods.<name>.agent !-> streamfl.methods.<other>"))[0] == (
        "streamfl.methods.%s.agent" % methods.BUILTIN[0], "streamfl.methods.%s" % methods.BUILTIN[1])


#: The repository's top-level entries: a backticked name starting with one may be a repository path.
TOP = {p.split("/")[0] for p in source_files()}
#: Top-level folders that share their name with an MQTT topic (``coordinator/status``): under
#: them only a name ending in ``/`` or in a file name with an extension is a path.
TOPIC_NAMES = {"coordinator", "device"}
#: The worked example's package, which the doc adds only in prose.
HYPOTHETICAL = {"methods/prox/"}


def named_paths() -> List[str]:
    """Backticked names in the doc that are repository paths: they start with a top-level entry,
    hold no space, colon or topic braces, and no placeholder but ``<name>`` (a shipped method)."""
    out = []
    for token in re.findall(r"`([^`\n]+)`", TEXT):
        token = token.strip()
        if " " in token or "{" in token or ":" in token or token in HYPOTHETICAL:
            continue
        first, _, rest = token.partition("/")
        if first not in TOP or not (rest or "." in token):
            continue
        if re.search(r"<(?!name>)", token):
            continue
        if first in TOPIC_NAMES and not (token.endswith("/") or "." in token.rsplit("/", 1)[-1]):
            continue
        out.append(token)
    return sorted(set(out))


def _exists(token: str) -> bool:
    names = methods.BUILTIN if "<name>" in token else ("",)
    for name in names:
        path = token.replace("<name>", name)
        if "*" in path and list(ROOT.glob(path)):
            return True
        if "*" not in path and (ROOT / path).exists():
            return True
    return False


def test_the_doc_names_paths():
    assert {"coordinator/core.py", "methods/__init__.py"} <= set(named_paths())


@pytest.mark.parametrize("token", named_paths())
def test_every_path_the_doc_names_exists(token):
    assert _exists(token), "docs/architecture.md names %s, which is not in the repository" % token


def bare_modules() -> List[str]:
    """Backticked bare Python file names (``teddi.py``), which the doc uses beside their folder."""
    return sorted(set(re.findall(r"`(\w+\.py)`", TEXT)))


@pytest.mark.parametrize("name", bare_modules())
def test_every_bare_module_name_is_a_file_of_the_repository(name):
    assert any(Path(p).name == name for p in source_files()), "no file %s in the repository" % name
