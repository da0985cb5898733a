"""The packages and modules of the checkout, as setup.py installs them: one list for every test.

setup.py's ``packages()`` reads them from the file tree (each of its ``ROOTS`` and every folder
below one that holds an ``__init__.py``); this module loads setup.py without running ``setup()``
(that happens only when it runs as a script) and turns the folders into paths and module names.
"""
import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]


def _load_setup() -> ModuleType:
    spec = importlib.util.spec_from_file_location("streamfl_setup", str(ROOT / "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SETUP = _load_setup()
#: ``{import name: folder}`` of the installed top-level packages (setup.py's ``ROOTS``).
ROOTS: Dict[str, str] = dict(SETUP.ROOTS)


def packages() -> Dict[str, Path]:
    """``{import name: folder}`` of every package setup.py installs."""
    return {name: ROOT / folder for name, folder in SETUP.packages(ROOT).items()}


def modules() -> Dict[str, Path]:
    """``{import name: file}`` of every module of those packages (a package is its ``__init__``)."""
    out = {}
    for package, folder in packages().items():
        for path in sorted(folder.glob("*.py")):
            out[package if path.stem == "__init__" else "%s.%s" % (package, path.stem)] = path
    return out


def source_files() -> List[str]:
    """The checkout's files as a clean clone plus the not-yet-committed, not-ignored ones would
    have them (paths relative to the root): what a wheel is built from, never build/ leftovers."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=str(ROOT), capture_output=True, check=True).stdout.decode()
    return [name for name in out.split("\0") if name and (ROOT / name).is_file()]
