"""The sfedpo method: its parts, declared for the registry (``streamfl.methods``); README.md here
says what it does, when to use it and how to turn it on."""
from streamfl.methods.base import MethodPackage, ReportSection

METHOD = MethodPackage(
    name='sfedpo',
    summary="SFedPO: distribution-guided admission of each latent state's windows (DDS) and shift-aware aggregation weights (SAW)",
    package=__name__,
    coordinator='coordinator:SfedpoPlugin',
    agent='agent:SfedpoAgentPlugin',
    payloads="payloads",
    buffer_policies=('buffer_policy:DdsPolicy',),
    presets="presets",
    reports=(ReportSection(
        'sfedpo',
        'accuracy at the end and over the run per method of latent-state runs, the best '
        'baseline and the margin over it; several folders make one table, with two plots '
        'beside them',
        render="report:section", many_runs=True),),
)
