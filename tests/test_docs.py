"""The docs stand alone and stay true: a short README naming the CI's test command, a page per
method that names every setting its plug-ins take, and no link or citation leading outside the
repository."""
import dataclasses
import re
from pathlib import Path

import pytest

from streamfl import methods

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
METHODS_DIR = ROOT / "methods"

#: Citations of things outside the repository: design notes, numbered references, the papers'
#: text files, the shared folder beside the repository, tracker issues.
OUTSIDE = [
    re.compile(r"DESIGN\.md", re.I),
    re.compile(r"\b(?:reference|ref\.?)\s+s\d", re.I),
    re.compile(r"\b(?:adaclp|sfedpo|st-ewc|stewc|fedteddi|session-init-dynamic-devices)\.txt\b", re.I),
    re.compile(r"[\w-]+\.txt\b(?=[^\n]*(?:sec\.|eq\.|section))", re.I),
    re.compile(r"\.\./shared\b"),
    re.compile(r"\bissue\s*#?\d+", re.I),
]

#: ``[text](target)``, not images' sources only: both must resolve.
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def doc_files():
    files = [README]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted(METHODS_DIR.glob("*/README.md"))
    return files


def method_packages():
    return sorted(p.parent for p in METHODS_DIR.glob("*/__init__.py"))


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 160, "README.md has %d lines; move detail into docs/" % len(lines)


def test_readme_names_the_ci_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in ci.splitlines()
                if line.strip() and not line.lstrip().startswith("#") and line.strip().startswith("make ")]
    assert commands, ".ci/run runs no make target"
    readme = README.read_text(encoding="utf-8")
    for command in commands:
        assert command in readme, "README.md does not name %r, the command .ci/run runs" % command
    assert "make demo" in readme


def test_every_method_package_has_a_page():
    missing = [p.name for p in method_packages() if not (p / "README.md").is_file()]
    assert not missing, "method packages without a README.md: %s" % ", ".join(missing)


def _config_fields():
    """``{package name: {field names}}`` over both sides' plug-ins."""
    out = {}
    for registry in (methods.coordinator_plugins(), methods.agent_plugins()):
        for name, cls in registry.items():
            config = getattr(cls, "Config", None)
            if config is not None and dataclasses.is_dataclass(config):
                out.setdefault(name, set()).update(f.name for f in dataclasses.fields(config))
    return out


@pytest.mark.parametrize("name,fields", sorted(_config_fields().items()))
def test_method_page_names_every_setting(name, fields):
    package = methods.get(name)
    folder = Path(__import__(package.package, fromlist=["_"]).__file__).parent
    page = (folder / "README.md").read_text(encoding="utf-8")
    missing = sorted(f for f in fields if not re.search(r"`%s`" % re.escape(f), page))
    assert not missing, "methods/%s/README.md does not document %s" % (folder.name, ", ".join(missing))


def test_methods_index_links_every_page():
    index = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    for package in method_packages():
        target = "../methods/%s/README.md" % package.name
        assert "(%s)" % target in index, "docs/methods.md does not link %s" % target


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_outside_reference(path):
    text = path.read_text(encoding="utf-8")
    for pattern in OUTSIDE:
        found = pattern.search(text)
        assert found is None, "%s cites something outside the repository: %r" % (
            path.relative_to(ROOT), found.group(0))


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # a URL, or an anchor on the same page
        file_part = target.split("#", 1)[0]
        if not (path.parent / file_part).exists():
            broken.append(target)
    assert not broken, "%s links to missing files: %s" % (path.relative_to(ROOT), ", ".join(broken))
