"""The sessions method: its parts, declared for the registry (``streamfl.methods``); README.md here
says what it does, when to use it and how to turn it on."""
from streamfl.methods.base import MethodPackage, ReportSection

METHOD = MethodPackage(
    name='sessions',
    summary='Session initialization for dynamic devices: a new session starts from a model built from the saved ones',
    package=__name__,
    coordinator='coordinator:SessionsPlugin',
    agent='agent:SessionsAgentPlugin',
    payloads="payloads",
    presets="presets",
    reports=(ReportSection(
        'sessions',
        "rounds, seconds and joules after each session boundary to shares of session-init's "
        'peak (option: the shares, default 0.95,0.97) and the accumulated gain over '
        'the previous model; several folders make one table',
        render="report:section", many_runs=True),),
)
