"""The importance method: its parts, declared for the registry (``streamfl.methods``); README.md here
says what it does, when to use it and how to turn it on."""
from streamfl.methods.base import MethodPackage

METHOD = MethodPackage(
    name='importance',
    summary='Importance sampling (a baseline of SFedPO): the windows, or the classes, with the largest gradient norm kept first',
    package=__name__,
    coordinator='coordinator:ImportancePlugin',
    agent='agent:ImportanceAgentPlugin',
    payloads="payloads",
    buffer_policies=('buffer_policy:ImportancePolicy', 'window_policy:WindowImportancePolicy'),
    presets="presets",
)
