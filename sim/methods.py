"""Named methods for the simulator: an aggregation strategy, a list of plug-ins with their
settings, a clock policy.

The simulator runs several methods on identical streams, devices and seeds and compares them. The
registry of named methods lives in ``streamfl.methods`` (shared with the coordinator's
``--method`` and ``streamfl methods``); this module re-exports it under the names the simulator
has always used. ``METHODS`` is the registry's own dict, kept up to date as methods register.
"""
from streamfl.methods import named_method as get_method
from streamfl.methods import named_methods, register_named as register, resolve_named as resolve
from streamfl.methods.base import Method

METHODS = named_methods()

__all__ = ["Method", "METHODS", "register", "get_method", "resolve"]
