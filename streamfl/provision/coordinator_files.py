"""The coordinator's YAML and key pair, and the operator's key pair and command line: what the
server side of a provisioned fleet runs with.

The coordinator YAML names the broker (the fleet file's first host, its port, the fleet CA), the
``coordinator`` account (its password file, or its certificate), the probe's own account
``coordinator-probe`` (``exclusive.probe_*``), the signing key (``signing_key_file``, made with
``streamfl.protocol.signing.generate_key_pair`` as ``streamfl-coordinator keygen`` makes it) and
the operator's public key (``operator.public_keys``). Paths are absolute: the coordinator may be
started from any folder. The fleet file's ``model:`` and ``coordinator:`` sections are laid over it.
"""
from pathlib import Path
from typing import Any, Dict, List, Tuple

import yaml

from streamfl.config import merge
from streamfl.errors import ConfigError
from streamfl.protocol.signing import generate_key_pair, load_private_key, public_key_text

COORDINATOR_KEY = "coordinator-signing"
OPERATOR_KEY = "operator-signing"


def signing_pair(folder: Path, name: str) -> Tuple[Path, str]:
    """``folder/name.key`` and its public key line: made once, then read (never replaced)."""
    key_path, pub_path = folder / (name + ".key"), folder / (name + ".pub")
    if not key_path.exists():
        if pub_path.exists():
            raise ConfigError("%s exists without its private key %s: move it away or put the key "
                              "back" % (pub_path, key_path))
        generate_key_pair(folder, name)
    public = public_key_text(load_private_key(key_path))
    if pub_path.exists() and pub_path.read_text(encoding="ascii").strip() != public:
        raise ConfigError("%s does not hold the public key of %s" % (pub_path, key_path))
    if not pub_path.exists():
        pub_path.write_text(public + "\n", encoding="ascii")
    return key_path, public


def mqtt_section(host: str, port: int, ca: Path, username: str, credentials: Dict[str, str]
                 ) -> Dict[str, Any]:
    """An ``mqtt:`` section: TLS with the fleet CA, the account and its credential files."""
    section: Dict[str, Any] = {"host": host, "port": port, "tls_ca": str(ca), "username": username}
    section.update(credentials)
    return section


def coordinator_yaml(fleet: str, model: Dict[str, Any], overrides: Dict[str, Any],
                     mqtt: Dict[str, Any], probe: Dict[str, str], signing_key: Path,
                     operator_keys: List[str]) -> Dict[str, Any]:
    """The coordinator's configuration as a mapping (``coordinator.config`` keys only)."""
    base: Dict[str, Any] = {"fleet": fleet}
    if model:
        base["model"] = model
    owned = {"signing_key_file": str(signing_key), "mqtt": mqtt,
             "operator": {"public_keys": list(operator_keys)}, "exclusive": dict(probe)}
    return merge(base, overrides, owned)


def dump(header: str, values: Dict[str, Any]) -> bytes:
    """YAML text with a comment header."""
    return ("".join("# %s\n" % line for line in header.splitlines())
            + yaml.safe_dump(values, sort_keys=False)).encode("utf-8")


def check_coordinator_yaml(path: Path) -> None:
    """Load ``path`` as ``streamfl-coordinator --config`` does; ``ConfigError`` saying which
    section of the fleet file to fix."""
    from streamfl.coordinator.config import load_config
    try:
        load_config(path)
    except ConfigError as exc:
        raise ConfigError("the coordinator YAML made from the fleet file does not load (fix its "
                          "model: or coordinator: section): %s" % exc) from None


def operator_command(kind: str, host: str, port: int, fleet: str, ca: Path,
                     credentials: List[str], signing_key: Path, coordinator_public: str) -> str:
    """The ``streamfl operator`` command line for this fleet's operator account."""
    return " ".join(["streamfl operator %s" % kind, "--broker", host, "--port", str(port),
                     "--fleet", fleet, "--tls-ca", str(ca)] + credentials
                    + ["--signing-key-file", str(signing_key),
                       "--coordinator-public-key", coordinator_public])
