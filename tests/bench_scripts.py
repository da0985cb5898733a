"""The scripts under bench/ as modules, for the tests that run them small (they are not a package)."""
import importlib.util
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parent.parent / "bench"


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` imported under the name ``bench_<name>``, freshly each call."""
    spec = importlib.util.spec_from_file_location("bench_" + name, BENCH_DIR / (name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
