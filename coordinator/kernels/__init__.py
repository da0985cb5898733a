"""The per-update loops over the model (admission's delta norm, FedAsync's mix): compiled with numba where it is installed, numpy otherwise."""
import logging
from typing import Dict, Type

from streamfl.coordinator.kernels.base import Kernels
from streamfl.coordinator.kernels.numpy_kernels import NumpyKernels

log = logging.getLogger(__name__)


def available() -> Dict[str, Type[Kernels]]:
    """``{name: Kernels class}`` of the implementations this installation can run."""
    found: Dict[str, Type[Kernels]] = {"numpy": NumpyKernels}
    try:
        from streamfl.coordinator.kernels.numba_kernels import NumbaKernels
    except ImportError:  # numba is in the server extra; a board's install may lack it
        log.debug("numba not installed: the coordinator's per-update loops run in numpy")
    else:
        found["numba"] = NumbaKernels
    return found


def default_kernels() -> Kernels:
    """The fastest implementation installed: numba's, else numpy's (the same mix, bit for bit)."""
    found = available()
    return found.get("numba", found["numpy"])()


__all__ = ["Kernels", "NumpyKernels", "available", "default_kernels"]
