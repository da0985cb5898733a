"""The criticalfl method: its parts, declared for the registry (``streamfl.methods``); README.md here
says what it does, when to use it and how to turn it on."""
from streamfl.methods.base import MethodPackage

METHOD = MethodPackage(
    name='criticalfl',
    summary='CriticalFL: synchronous rounds whose client count doubles inside the critical period and halves after',
    package=__name__,
    coordinator='coordinator:CriticalFlPlugin',
    presets="presets",
)
