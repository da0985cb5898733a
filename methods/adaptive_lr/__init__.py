"""The adaptive_lr method: its parts, declared for the registry (``streamfl.methods``); README.md here
says what it does, when to use it and how to turn it on."""
from streamfl.methods.base import MethodPackage

METHOD = MethodPackage(
    name='adaptive_lr',
    summary="Adaptive-FedAvg (a baseline of SFedPO): each round's learning rate from the global model's drift",
    package=__name__,
    coordinator='coordinator:AdaptiveLrPlugin',
    agent='agent:AdaptiveLrAgentPlugin',
    payloads="payloads",
    presets="presets",
)
