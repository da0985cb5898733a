"""The schedule method: its parts, declared for the registry (``streamfl.methods``); README.md here
says what it does, when to use it and how to turn it on."""
from streamfl.methods.base import MethodPackage, ReportSection

METHOD = MethodPackage(
    name='schedule',
    summary="Device scheduling: FedTeddi's drift- and divergence-aware choice of who trains, and its baselines",
    package=__name__,
    coordinator='coordinator:SchedulePlugin',
    agent='agent:ScheduleAgentPlugin',
    payloads="payloads",
    presets="presets",
    reports=(ReportSection(
        'frames',
        'rounds to target accuracies on the classes seen so far after each new-class frame, '
        'compared with the reference method (option: the comma-separated targets, with '
        '--overview one list per folder separated by ";")',
        render="report:section", many_runs=True),),
    sim="sim",
)
