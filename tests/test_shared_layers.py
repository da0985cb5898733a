"""The layers every method shares name no method: a method's code, settings and words live in its
package (``streamfl.methods.<name>``), so adding, removing or renaming one touches no shared file.

Each shared file is searched, code, comments and docstrings alike, for every registered method's
name and the words of the methods' papers, as whole words in any case; a hit fails naming its
file and line.
"""
import re
from pathlib import Path
from typing import Iterable, List

import pytest

from streamfl import methods
from streamfl.dvfs.policies.factory import POLICIES

ROOT = Path(__file__).resolve().parent.parent

#: The shared layers: both cores, the wire protocol, the simulator's runtime, the two daemons, the
#: DVFS policies' input and the ``streamfl`` command.
SHARED = (["coordinator/core.py", "agent/core.py", "sim/runtime.py", "agent/daemon.py",
           "coordinator/server.py", "streamfl/cli.py"]
          + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "protocol").rglob("*.py"))
          + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "dvfs" / "policies").glob("*.py")
                   # AdaCLP's CLP-aware DVFS itself, the policy named "clp-aware": its module is
                   # the method's clock policy and cites the paper it implements.
                   if p.name != "clp_aware.py"))

#: The methods' papers' words besides the package names.
PAPER_WORDS = ("adaclp", "fedteddi", "teddi", "st-ewc", "latent", "session-init")

#: The DVFS policies' names (``dvfs.policy``, "clp-aware" among them) are not method names: a
#: policy is chosen per board, whatever the fleet's methods; they are blanked out before the search.
POLICY_NAMES = tuple(sorted(POLICIES, key=len, reverse=True))


#: Words that must stay in a file, with why: ``{path: {word: reason}}``.
ALLOWED = {
    "protocol/transport/memory.py": {
        "sessions": "MQTT's persistent sessions (a broker's state per client), not the method"},
}


def method_words() -> List[str]:
    return sorted(set(methods.packages()) | set(PAPER_WORDS), key=len, reverse=True)


def pattern() -> "re.Pattern":
    words = "|".join(re.escape(w) for w in method_words())
    return re.compile(r"(?<!\w)(%s)(?!\w)" % words, re.IGNORECASE)


def named(line: str, allowed: Iterable[str] = ()) -> bool:
    """Whether ``line`` names a method (a DVFS policy's name and the ``allowed`` words do not count)."""
    blank = re.compile("|".join(re.escape(p) for p in POLICY_NAMES), re.IGNORECASE)
    allowed = {w.lower() for w in allowed}
    return any(m.group(1).lower() not in allowed for m in pattern().finditer(blank.sub(" ", line)))


def hits(path: str) -> List[str]:
    """``file:line: text`` of each line of ``path`` naming a method."""
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    allowed = ALLOWED.get(path, {})
    return ["%s:%d: %s" % (path, n, line.strip()) for n, line in enumerate(lines, 1)
            if named(line, allowed)]


def test_the_search_finds_a_method_name_and_skips_a_policy_name():
    assert named("x = 1  # AdaCLP eq. 1") and named('plugins["clp"] = {}')
    assert named("an ablation: adaclp-no-dvfs") and named("ST-EWC's term")
    assert not named('policy = "clp-aware"') and not named("new_sessions = 0")
    assert not named("persistent sessions", {"sessions"}) and named("sessions and clp", {"sessions"})


@pytest.mark.parametrize("path", SHARED)
def test_a_shared_layer_names_no_method(path):
    assert (ROOT / path).exists(), path
    found = hits(path)
    assert not found, "method names in a shared layer:\n" + "\n".join(found)
