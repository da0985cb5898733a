"""One kit per board, ``kits/<id>/``: its ``agent.yaml``, the fleet CA, its credentials and the
board install script, which copies every kit file but itself and ``README*`` into
``/etc/streamfl/`` (``BOARD_DIR``). The agent.yaml names its files by those installed paths.

The install script is the package's own (``streamfl/deploy/install_board.sh``, read as package
data of ``streamfl.deploy``), copied so a kit is all a board needs besides the wheelhouse.
"""
import logging
import pkgutil
from pathlib import Path
from typing import Any, Dict, Optional

from streamfl.config import merge
from streamfl.errors import ConfigError

log = logging.getLogger(__name__)

#: Where the install script puts a kit's files on the board.
BOARD_DIR = Path("/etc/streamfl")
AGENT_YAML = "agent.yaml"
CA_FILE = "ca.crt"
PASSWORD_FILE = "mqtt-password"
CERT_FILE = "client.crt"
KEY_FILE = "client.key"
INSTALL_SCRIPT = "install_board.sh"
SCRIPT_PACKAGE = "streamfl.deploy"


def credential_keys(certificate_auth: bool) -> Dict[str, str]:
    """The ``mqtt:`` keys naming a board's credential files at their installed paths."""
    if certificate_auth:
        return {"tls_cert": str(BOARD_DIR / CERT_FILE), "tls_key": str(BOARD_DIR / KEY_FILE)}
    return {"password_file": str(BOARD_DIR / PASSWORD_FILE)}


def agent_yaml(fleet: str, board_id: str, kind: str, host: str, port: int, certificate_auth: bool,
               coordinator_public: str, model: Dict[str, Any], fleet_agent: Dict[str, Any],
               board_agent: Dict[str, Any]) -> Dict[str, Any]:
    """One board's agent configuration as a mapping (``agent.config`` keys only)."""
    base: Dict[str, Any] = {"fleet": fleet, "device_id": board_id, "board": kind}
    if model:
        base["model"] = model
    mqtt = {"host": host, "port": port, "tls_ca": str(BOARD_DIR / CA_FILE), "username": board_id}
    mqtt.update(credential_keys(certificate_auth))
    owned = {"fleet": fleet, "device_id": board_id, "board": kind,
             "coordinator_public_key": coordinator_public, "mqtt": mqtt}
    return merge(base, fleet_agent, board_agent, owned)


def check_agent_yaml(path: Path, board_id: str) -> None:
    """Load ``path`` as ``streamfl-agent --config`` does (the files it names are on the board, not
    here); ``ConfigError`` saying which section of the fleet file to fix."""
    from streamfl.agent.config import load_agent_config
    try:
        load_agent_config(path)
    except ConfigError as exc:
        raise ConfigError("board %s: the agent.yaml made from the fleet file does not load (fix "
                          "its model: or agent: section): %s" % (board_id, exc)) from None


def install_script() -> Optional[bytes]:
    """The board install script from the package, or None where this streamfl has none yet."""
    try:
        return pkgutil.get_data(SCRIPT_PACKAGE, INSTALL_SCRIPT)
    except (ImportError, OSError) as exc:
        log.debug("no %s in %s: %s", INSTALL_SCRIPT, SCRIPT_PACKAGE, exc)
        return None


def readme(board_id: str, kind: str, fleet: str, files: Dict[str, str]) -> str:
    """The kit's README.txt: what it holds and how it goes onto the board."""
    lines = ["streamfl kit for board %s (%s) of fleet %s, made by 'streamfl provision'." % (
        board_id, kind, fleet), "",
        "Copy this folder to the board and run there, as root:", "",
        "    sudo sh install_board.sh --wheelhouse <wheelhouse folder> --kit .", "",
        "It installs the agent from the wheelhouse ('make dist': dist/wheelhouse/<target>/) and "
        "copies these files into %s/ (owner root, group streamfl):" % BOARD_DIR, ""]
    lines += ["    %-14s %s" % (name, what) for name, what in files.items()]
    lines += ["", "Keep the kit as secret as its key or password: it is this board's identity."]
    return "\n".join(lines) + "\n"
