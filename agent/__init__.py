"""The on-device agent: window buffer, local trainer, sans-I/O core, daemon runtime and CLI.

Names are imported lazily (PEP 562) so ``python -m streamfl.agent --help`` does not load torch.
"""
import importlib

#: Exported name -> the module holding it, relative to this package (``..notify`` is the root
#: package's ``streamfl.notify``, shared with the coordinator).
_EXPORTS = {
    "AgentConfig": ".config", "MqttConfig": ".config", "load_agent_config": ".config",
    "AgentCore": ".core", "RoundPlan": ".core", "NotReadyError": ".core", "DivergedError": ".core",
    "RoundInterrupted": ".core",
    "Buffer": ".buffer", "ReplacementPolicy": ".buffer_policies", "FifoPolicy": ".buffer_policies",
    "ReservoirPolicy": ".buffer_policies",
    "LocalTrainer": ".trainer", "TrainResult": ".trainer",
    "Outbox": ".outbox", "StateDir": ".state", "SystemdNotifier": "..notify", "AgentDaemon": ".daemon",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    return getattr(importlib.import_module(module, __name__), name)
