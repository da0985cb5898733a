"""The stewc method: its parts, declared for the registry (``streamfl.methods``); README.md here
says what it does, when to use it and how to turn it on."""
from streamfl.methods.base import MethodPackage, ReportSection

METHOD = MethodPackage(
    name='stewc',
    summary="ST-EWC: the temporal EWC term over past periods' Fisher matrices",
    package=__name__,
    coordinator='coordinator:StEwcPlugin',
    agent='agent:StEwcAgentPlugin',
    payloads="payloads",
    presets="presets",
    reports=(ReportSection(
        'periods',
        'the continual-learning metrics of a domain-incremental run (accuracy on period 1, '
        'average and overall accuracy, compared with the reference method) and periods.png '
        'beside it',
        render="report:section", many_runs=False),),
)
