"""Client sampling has no named run of its own: scenarios switch it on with ``plugins.sampling``."""
from typing import List

from streamfl.methods.base import Method

#: The named simulator runs of this method (none).
PRESETS: List[Method] = []
