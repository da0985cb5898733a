"""The sampling method: its parts, declared for the registry (``streamfl.methods``); README.md here
says what it does, when to use it and how to turn it on."""
from streamfl.methods.base import MethodPackage

METHOD = MethodPackage(
    name='sampling',
    summary='Client sampling: a random set of devices trains each synchronous round, the rest are told to skip',
    package=__name__,
    coordinator='coordinator:SamplingPlugin',
    presets="presets",
)
