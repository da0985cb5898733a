"""The fedcurv method: its parts, declared for the registry (``streamfl.methods``); README.md here
says what it does, when to use it and how to turn it on."""
from streamfl.methods.base import MethodPackage

METHOD = MethodPackage(
    name='fedcurv',
    summary="FedCurv: devices train with the peers' Fisher-weighted penalty (the spatial term ST-EWC reuses)",
    package=__name__,
    coordinator='coordinator:FedCurvPlugin',
    agent='agent:FedCurvAgentPlugin',
    payloads="payloads",
    presets="presets",
)
