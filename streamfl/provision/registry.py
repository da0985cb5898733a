"""``fleet-state.json``: what provisioning issued to whom and what it revoked, so a re-run adds
boards without re-keying the others and a revoked board stays revoked (and in the CRL).

It holds no secret: ids, kinds, certificate serials and fingerprints, and dates. The private keys
and passwords live in their own files, which a re-run reads and never rewrites.
"""
import datetime
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from streamfl.errors import ConfigError
from streamfl.fileio import atomic_write

FILE_NAME = "fleet-state.json"
FORMAT = 1
ACTIVE, REVOKED = "active", "revoked"


def now_text() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


class Registry:
    """The output folder's record of its fleet, boards and accounts."""

    def __init__(self, path: Path, data: Optional[Dict[str, Any]] = None):
        self.path = Path(path)
        self.data: Dict[str, Any] = data or {"format": FORMAT, "boards": {}, "accounts": {}}

    @classmethod
    def load(cls, folder: Path) -> "Registry":
        """The registry of ``folder`` (an empty one if there is none yet)."""
        path = Path(folder) / FILE_NAME
        if not path.exists():
            return cls(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError("cannot read %s: %s" % (path, exc)) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigError("%s is not a fleet state file of format %d" % (path, FORMAT))
        data.setdefault("boards", {})
        data.setdefault("accounts", {})
        return cls(path, data)

    @property
    def exists(self) -> bool:
        return self.path.exists()

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value

    @property
    def boards(self) -> Dict[str, Dict[str, Any]]:
        return self.data["boards"]

    @property
    def accounts(self) -> Dict[str, Dict[str, Any]]:
        return self.data["accounts"]

    def board(self, board_id: str) -> Optional[Dict[str, Any]]:
        return self.boards.get(board_id)

    def active_boards(self) -> List[str]:
        """Ids of the boards not revoked, in the order they were issued."""
        return [b for b, rec in self.boards.items() if rec.get("state") == ACTIVE]

    def revoked_boards(self) -> List[str]:
        return [b for b, rec in self.boards.items() if rec.get("state") == REVOKED]

    def add_board(self, board_id: str, record: Dict[str, Any]) -> None:
        record = dict(record, state=ACTIVE, issued=now_text())
        self.boards[board_id] = record

    def revoke(self, board_id: str, reason: str = "") -> Dict[str, Any]:
        """Mark ``board_id`` revoked (kept in the file, with when and why)."""
        record = self.boards.get(board_id)
        if record is None:
            raise ConfigError("--revoke %s: no such board in %s (known: %s)" % (
                board_id, self.path, ", ".join(self.boards) or "none"))
        if record.get("state") == REVOKED:
            raise ConfigError("--revoke %s: already revoked at %s" % (board_id, record.get("revoked")))
        record["state"] = REVOKED
        record["revoked"] = now_text()
        if reason:
            record["revoked_reason"] = reason
        return record

    def save(self) -> None:
        self.data["updated"] = now_text()
        atomic_write(self.path, (json.dumps(self.data, indent=2, sort_keys=False) + "\n").encode())
