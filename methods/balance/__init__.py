"""The balance method: its parts, declared for the registry (``streamfl.methods``); README.md here
says what it does, when to use it and how to turn it on."""
from streamfl.methods.base import MethodPackage

METHOD = MethodPackage(
    name='balance',
    summary='Class-balanced mixing (ours): updates of the classes the model already holds too much of weigh less',
    package=__name__,
    coordinator='coordinator:BalancePlugin',
    presets="presets",
)
