"""The clp method: its parts, declared for the registry (``streamfl.methods``); README.md here
says what it does, when to use it and how to turn it on."""
from streamfl.methods.base import MethodPackage

METHOD = MethodPackage(
    name='clp',
    summary='AdaCLP: the federated critical-learning-period probe on the coordinator, CLP-set hyper-parameters on the devices (AdaCLP eq. 1-6)',
    package=__name__,
    coordinator='coordinator:ClpProbePlugin',
    agent='agent:ClpAgentPlugin',
    payloads="payloads",
    presets="presets",
    sim="sim",
)
