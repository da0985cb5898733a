"""The stewc method: its parts, declared for the registry (``streamfl.methods``); README.md here
says what it does, when to use it and how to turn it on."""
from streamfl.methods.base import MethodPackage

METHOD = MethodPackage(
    name='stewc',
    summary="ST-EWC: the temporal EWC term over past periods' Fisher matrices",
    package=__name__,
    coordinator='coordinator:StEwcPlugin',
    agent='agent:StEwcAgentPlugin',
    payloads="payloads",
    presets="presets",
)
