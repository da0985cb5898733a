"""setup.py installs every package of the file tree, and the agent side never needs the server's.

The wheel itself, installed into a fresh virtual environment, is tested in test_wheel_install.py.
"""
from pathlib import Path

import pytest

from source_tree import ROOT, ROOTS, SETUP, packages, source_files


def test_the_packages_come_from_the_tree():
    found = packages()
    for name, folder in {"streamfl": "streamfl", "streamfl.boards": "configs/boards",
                         "streamfl.methods.sessions.initializers": "methods/sessions/initializers",
                         "streamfl.methods.stewc.periods": "methods/stewc/periods",
                         "streamfl.methods.sfedpo.latent": "methods/sfedpo/latent",
                         "streamfl.protocol.transport": "protocol/transport",
                         "streamfl.dvfs.fake": "dvfs/fake"}.items():
        assert found[name] == ROOT / folder


def test_a_new_folder_with_an_init_is_a_package_and_one_without_is_not(tmp_path):
    for folder in ROOTS.values():
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "agent/added/deeper").mkdir(parents=True)
    (tmp_path / "agent/added/__init__.py").write_text("")
    (tmp_path / "agent/added/deeper/__init__.py").write_text("")
    (tmp_path / "coordinator/data").mkdir()
    (tmp_path / "coordinator/data/notes.py").write_text("")
    found = SETUP.packages(tmp_path)
    assert found["streamfl.agent.added"] == "agent/added"
    assert found["streamfl.agent.added.deeper"] == "agent/added/deeper"
    assert not any(name.startswith("streamfl.coordinator.data") for name in found)
    assert set(found) == set(ROOTS) | {"streamfl.agent.added", "streamfl.agent.added.deeper"}


def test_a_missing_top_level_package_is_an_error_naming_its_init(tmp_path):
    for folder in ROOTS.values():
        (tmp_path / folder).mkdir(parents=True)
        if folder != "protocol":
            (tmp_path / folder / "__init__.py").write_text("")
    with pytest.raises(FileNotFoundError, match="streamfl.protocol needs protocol/__init__.py"):
        SETUP.packages(tmp_path)


def test_every_init_of_the_checkout_is_an_installed_package():
    """A package folder outside ``ROOTS``, or below a folder without ``__init__.py``, would be left
    out of the wheel without a word."""
    installed = {path.resolve() for path in packages().values()}
    # Packages under tests/ are the tests' own (tests/toy_method/ is a method from outside
    # streamfl on purpose), never shipped.
    stray = [name for name in source_files()
             if Path(name).name == "__init__.py" and not name.startswith("tests/")
             and (ROOT / name).parent.resolve() not in installed]
    assert stray == []


def test_every_module_under_the_package_folders_is_in_a_package():
    """A ``.py`` file in a folder without ``__init__.py`` would be missing from the wheel."""
    installed = {path.resolve() for path in packages().values()}
    roots = [Path(folder) for folder in ROOTS.values()]
    orphans = [name for name in source_files() if name.endswith(".py")
               and any(root in Path(name).parents for root in roots)
               and (ROOT / name).parent.resolve() not in installed]
    assert orphans == []


def test_agent_side_does_not_import_coordinator():
    for folder in ("agent", "protocol", "sensors", "models"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            assert "streamfl.coordinator" not in text, path
