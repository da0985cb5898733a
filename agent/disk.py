"""The free space of the agent's state folder, for telemetry: a full SD card stops checkpoints and
the outbox, so the fleet's alerts must see it coming (``shutil.disk_usage``, one ``statvfs``)."""
import logging
import shutil
from pathlib import Path
from typing import Dict, Optional

log = logging.getLogger(__name__)


def state_disk(path: Path) -> Dict[str, Optional[int]]:
    """``Telemetry``'s disk fields for the filesystem holding ``path``: bytes free to this user
    and the filesystem's size; both None when it cannot be read (telemetry is best effort)."""
    try:
        usage = shutil.disk_usage(str(path))
    except OSError as exc:
        log.debug("free space of %s unreadable: %s", path, exc)
        return {"state_disk_free_bytes": None, "state_disk_size_bytes": None}
    return {"state_disk_free_bytes": int(usage.free), "state_disk_size_bytes": int(usage.total)}
