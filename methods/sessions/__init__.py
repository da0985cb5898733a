"""The sessions method: its parts, declared for the registry (``streamfl.methods``); README.md here
says what it does, when to use it and how to turn it on."""
from streamfl.methods.base import MethodPackage

METHOD = MethodPackage(
    name='sessions',
    summary='Session initialization for dynamic devices: a new session starts from a model built from the saved ones',
    package=__name__,
    coordinator='coordinator:SessionsPlugin',
    agent='agent:SessionsAgentPlugin',
    payloads="payloads",
    presets="presets",
)
