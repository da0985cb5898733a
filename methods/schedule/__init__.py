"""The schedule method: its parts, declared for the registry (``streamfl.methods``); README.md here
says what it does, when to use it and how to turn it on."""
from streamfl.methods.base import MethodPackage

METHOD = MethodPackage(
    name='schedule',
    summary="Device scheduling: FedTeddi's drift- and divergence-aware choice of who trains, and its baselines",
    package=__name__,
    coordinator='coordinator:SchedulePlugin',
    agent='agent:ScheduleAgentPlugin',
    payloads="payloads",
    presets="presets",
)
