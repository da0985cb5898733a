"""A board wheelhouse for THIS machine (x86-64, this Python), so tests can run the board install
script as a user does: ``streamfl.deploy.dist`` builds it from the wheels of the versions
installed here (the field lab's download cache, else downloaded once), torch left out as on a
Jetson; an installed venv reaches this interpreter's torch as a system-wide one
(``--system-site-packages``) through a user site whose ``.pth`` names the field lab's torch layer.
Installing from it may not use the network: ``NO_INDEX`` is a closed loopback port for pip."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from source_tree import ROOT
from streamfl.deploy import dist

sys.path.append(str(ROOT))  # the repository root, for field/
from field import install as field_install  # noqa: E402

#: A closed loopback port: any index request pip made would fail at once.
NO_INDEX = "http://127.0.0.1:9/simple/"


def clean_env(**extra):
    """This environment without pip's and Python's path settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONNOUSERSITE")}
    env.update(PIP_CONFIG_FILE="/dev/null", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def local_wheels(tmp: Path) -> Path:
    """A folder holding a wheel of each agent dependency at its installed version, and pip's."""
    import pip
    pins = field_install.pinned_dependencies() + ["pip==%s" % pip.__version__]
    out = tmp / "links"
    out.mkdir()
    caches = sorted(field_install.CACHE.glob("wheelhouse-*"))
    missing = []
    for pin in pins:
        name, version = pin.split("==")
        key = name.lower().replace("-", "_").replace(".", "_")
        found = [w for c in caches for w in c.glob("*.whl")
                 if w.name.split("-")[0].lower().replace(".", "_") == key and w.name.split("-")[1] == version]
        if found:
            os.symlink(str(found[0]), str(out / found[0].name))
        else:
            missing.append(pin)
    if missing:  # building the wheelhouse may use the network; installing from it may not
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "--no-deps",
                        "-d", str(out)] + missing, check=True, env=clean_env())
    return out


def build(tmp: Path) -> Path:
    """The wheelhouse of this machine's target under ``tmp``, from the checkout's wheel."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("PIP_")}
    os.environ["PIP_CONFIG_FILE"] = "/dev/null"
    try:
        wheel = dist.build_wheel(ROOT, tmp / "out")
        links = local_wheels(tmp)
        return dist.build_wheelhouse(dist.host_target(), wheel, tmp / "out" / "wheelhouse",
                                     ["--no-index", "--find-links", str(links)])
    finally:
        os.environ.pop("PIP_CONFIG_FILE", None)
        os.environ.update(saved)


def torch_user_base(tmp: Path) -> Path:
    """A user base (``PYTHONUSERBASE``) whose site's .pth puts a torch layer (links to this
    interpreter's torch) on the path of every venv made with ``--system-site-packages``."""
    saved = field_install.CACHE
    field_install.CACHE = tmp  # the layer of links goes here, not into the field lab's cache
    try:
        layer = field_install.torch_layer()
    finally:
        field_install.CACHE = saved
    site = tmp / "userbase" / "lib" / ("python%d.%d" % sys.version_info[:2]) / "site-packages"
    site.mkdir(parents=True)
    (site / "streamfl-test-torch.pth").write_text(str(layer) + "\n")
    return tmp / "userbase"


@pytest.fixture(scope="module")
def house(tmp_path_factory):
    """A wheelhouse of this machine (``make dist``'s code, for x86-64 and this Python)."""
    return build(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def torch_base(tmp_path_factory):
    """A user base whose .pth puts a torch layer (links to this interpreter's torch) on the path."""
    return torch_user_base(tmp_path_factory.mktemp("torch"))
