"""A toy method kept beside the tests, outside the streamfl package: the proof that a method is
one package. It halves the devices' learning rate while the coordinator runs it, and each update
reports how many windows the device saw; the coordinator logs that count in the update's record.
It is registered by a test (``streamfl.methods.register``) or, installed as a distribution, under
the ``streamfl.methods`` entry-point group; no file of streamfl changes for it."""
from streamfl.methods.base import MethodPackage

METHOD = MethodPackage(
    name="toy",
    summary="Toy: halves the devices' learning rate and logs the windows each device saw",
    package=__name__,
    coordinator="coordinator:ToyPlugin",
    agent="agent:ToyAgentPlugin",
    payloads="payloads",
    presets="presets",
)
