"""No tracked file points outside the repository: users get no design notes, no paper text files,
no reference document and no issue tracker, so comments cite a paper by title and equation, or say
the fact, or name a file in this repository."""
import fnmatch
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
THIS = "tests/test_no_outside_references.py"

#: Files another change is rewriting: their hits are expected to go, not yet enforced.
BEING_REWRITTEN = ()

#: Tracked files never read: recorded figures, not prose.
SKIPPED = ("tests/golden/*.json",)

#: Pointers outside the repository: design notes, a numbered reference document and its sections,
#: the papers' text files, the shared folder beside the repository, tracker issues. Other ``.txt``
#: names (requirements, a password file in a test) are data, not citations.
OUTSIDE = [
    re.compile(r"DESIGN\.md|\bDESIGN s\d", re.I),
    re.compile(r"\b(?:reference|ref\.?)\s+s\d", re.I),
    re.compile(r"\b(?:adaclp|sfedpo|st-ewc|stewc|fedteddi|session-init-dynamic-devices)\.txt\b", re.I),
    re.compile(r"[\w-]+\.txt\b(?=[^\n]*(?:sec\.|eq\.|section|algorithm))", re.I),
    re.compile(r"\.\./shared\b|\bshared/reference\b|dvfs-sysfs\.md", re.I),
    re.compile(r"\bissue\s*#?\d+", re.I),
]


def tracked_files():
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=str(ROOT), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    names = [n for n in out.decode("utf-8", "replace").split("\0") if n]
    return sorted(n for n in names
                  if n != THIS and not any(fnmatch.fnmatch(n, p) for p in SKIPPED))


def _param(name):
    if any(fnmatch.fnmatch(name, p) for p in BEING_REWRITTEN):
        return pytest.param(name, marks=pytest.mark.xfail(reason="being rewritten", strict=False))
    return name


FILES = tracked_files()


def hits(name):
    """``file:line: text`` for every outside pointer in ``name``; none for binaries."""
    path = ROOT / name
    if not path.is_file():
        return []
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if any(p.search(line) for p in OUTSIDE):
            found.append("%s:%d: %s" % (name, number, line.strip()[:120]))
    return found


def test_the_repository_is_listed():
    if not FILES:
        pytest.skip("not a git checkout: no tracked files to read")
    assert THIS not in FILES and any(n.endswith(".py") for n in FILES)


@pytest.mark.parametrize("name", [_param(n) for n in FILES])
def test_no_outside_references(name):
    found = hits(name)
    assert not found, "points outside the repository:\n" + "\n".join(found)


def test_the_patterns_catch_what_they_should():
    # Split literals, so that a grep of the tree for these patterns does not find this list.
    bad = ["see DESIGN" ".md s8", "(reference" " s3.4)", "ref s1.5", "adaclp.txt eq. 2", "paper.txt sec. 3",
           ".." "/shared/x", "(issue 3, point 6)", "issue #12", "dvfs-sysfs.md"]
    good = ["requirements.txt", "password.txt", "the reference method", "AdaCLP eq. 2-3",
            "an issue with the broker"]
    assert all(any(p.search(s) for p in OUTSIDE) for s in bad)
    assert not any(any(p.search(s) for p in OUTSIDE) for s in good)
