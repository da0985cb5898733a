"""A new software version over the same state folder continues the run; a state folder written by a
NEWER version stops the start, naming both, instead of being read as far as it goes.

``tests/golden/state-format-1`` is a state folder as this version writes it (state format 1):
``CoordinatorCore`` with ``factories.SPEC``, fedasync, run ``golden-run-format-1``, device ``d1``
greeted, updates ``u0``..``u2`` aggregated to version 3, saved by ``Persister.flush``. It is kept
byte for byte: a later release that cannot load it breaks every fleet that upgrades. Do not
rewrite it when the format changes; add a folder of the new format beside it.
"""
import json
import shutil
from pathlib import Path

import pytest

from factories import SPEC, UNBOUNDED_ADMISSION, make_update
from streamfl import __version__
from streamfl.coordinator.admission import AdmissionConfig
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.coordinator.core import CoordinatorCore
from streamfl.coordinator.persistence import STATE_FORMAT, Persister, StateStore
from streamfl.errors import StateFileError

GOLDEN = Path(__file__).resolve().parent / "golden" / "state-format-1"


def _config() -> CoordinatorConfig:
    return CoordinatorConfig(model=SPEC, admission=AdmissionConfig(**UNBOUNDED_ADMISSION))


def _restart(state_dir: Path) -> CoordinatorCore:
    loaded = StateStore(state_dir).load(SPEC)
    assert loaded is not None
    tensors, state = loaded
    core = CoordinatorCore(_config(), tensors=tensors)
    core.restore(tensors, state, now=100.0)
    return core


def test_a_state_folder_of_format_1_continues_the_run(tmp_path):
    shutil.copytree(str(GOLDEN), str(tmp_path / "state"))
    core = _restart(tmp_path / "state")
    assert (core.version, core.run_id) == (3, "golden-run-format-1")
    assert core.registry.greeted("d1") and core.counters["aggregated"] == 3
    # The updates it had merged are still known (a repeat from an outbox is a duplicate) ...
    repeat = core.on_message(make_update(update_id="u2", base_version=2), now=101.0)
    assert repeat.update.outcome == "duplicate"
    # ... and a new one is merged into the version it saved.
    new = core.on_message(make_update(update_id="u3", base_version=3), now=102.0)
    assert new.update.aggregated and core.version == 4
    Persister(StateStore(tmp_path / "state")).flush(core)
    saved = json.loads((tmp_path / "state" / "state.json").read_text())
    assert saved["format"] == STATE_FORMAT and saved["written_by"] == __version__


def test_a_state_of_a_newer_format_stops_the_start_naming_both_versions(tmp_path):
    state_dir = tmp_path / "state"
    shutil.copytree(str(GOLDEN), str(state_dir))
    doc = json.loads((state_dir / "state.json").read_text())
    doc.update(format=STATE_FORMAT + 1, written_by="9.9.9")
    (state_dir / "state.json").write_text(json.dumps(doc))
    before = (state_dir / "state.json").read_bytes()
    with pytest.raises(StateFileError) as caught:
        StateStore(state_dir).load(SPEC)
    message = str(caught.value)
    for part in ("state.json", "newer streamfl", "9.9.9", __version__,
                 "format %d" % (STATE_FORMAT + 1), "up to %d" % STATE_FORMAT):
        assert part in message, (part, message)
    assert (state_dir / "state.json").read_bytes() == before
    assert caught.value.exit_code == 2
