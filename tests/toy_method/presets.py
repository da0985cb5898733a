"""The toy method's named simulator run."""
from streamfl.methods.base import FEDASYNC, Method

PRESETS = [Method("toy-fedasync", "FedAsync with the toy method", coordinator=FEDASYNC, plugins={"toy": {}})]
