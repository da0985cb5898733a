"""The broker's config and ACL, made from the SHIPPED ``configs/mosquitto/streamfl.conf`` and
``acl`` by rewriting only what must differ, so that what is tested and reviewed there is what runs.

- the conf: each option named in ``values`` gets its new value (the paths, the ``listener``, the
  certificate variant's ``require_certificate``); ``None`` comments the option out (a
  certificate fleet has no password file); ``after`` adds lines below an option (``crlfile``,
  ``use_identity_as_username``). Every other line, comments included, is kept as it is.
- the ACL: its two example device blocks (``user pi-01``, ``user pi-02``) are replaced, where the
  first stood, by one block of the same lines per board. Every ``pattern`` line and every role
  block (coordinator, probe, operator, dashboard) is kept, so a line added to the shipped file
  reaches every generated one.

The field lab (``field/broker.py``) uses the same two rewrites for its test broker.
"""
import importlib.util
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

from streamfl.errors import ConfigError

#: The shipped ACL's example device blocks, replaced by one block per board.
EXAMPLE_DEVICES = ("pi-01", "pi-02")
#: Where the shipped files live in a source tree (a clone, an editable install).
TREE_DIR = Path(__file__).resolve().parents[2] / "configs" / "mosquitto"
#: A data package that may carry them in an installed wheel.
DATA_PACKAGE = "streamfl.mosquitto"


class ShippedFileError(ConfigError):
    """The shipped broker files are missing or no longer look as this rewrite expects."""


def shipped_dir(override: Optional[Path] = None) -> Path:
    """The folder of the shipped ``streamfl.conf`` and ``acl``: ``override``, else the data
    package, else the source tree beside this package."""
    candidates: List[Path] = []
    if override is not None:
        candidates.append(Path(override))
    else:
        try:
            spec = importlib.util.find_spec(DATA_PACKAGE)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            candidates.extend(Path(p) for p in spec.submodule_search_locations)
        candidates.append(TREE_DIR)
    for folder in candidates:
        if (folder / "streamfl.conf").is_file() and (folder / "acl").is_file():
            return folder
    raise ShippedFileError(
        "the shipped broker files (streamfl.conf, acl) are not in %s: run streamfl provision from "
        "a clone of the repository, or pass --shipped-broker-dir with its configs/mosquitto"
        % " or ".join(str(c) for c in candidates))


def deployed_conf(shipped: str, values: Mapping[str, Optional[str]],
                  after: Optional[Mapping[str, Sequence[str]]] = None, header: str = "") -> str:
    """``shipped`` with the value of each option named in ``values`` replaced (``None``: the line
    commented out) and the lines of ``after[option]`` added below that option; every other line is
    kept as it is. Each option named must occur exactly once (else ``ShippedFileError``: the shipped
    file changed under this tool)."""
    after = after or {}
    seen = {key: 0 for key in list(values) + list(after)}
    lines = [header] if header else []
    for line in shipped.splitlines(keepends=True):
        key = line.split(" ", 1)[0]
        if key in seen:
            seen[key] += 1
        if key in values:
            value = values[key]
            line = ("%s %s\n" % (key, value) if value is not None
                    else "# %s: not used here (streamfl provision)\n" % key)
        elif not line.endswith("\n"):
            line += "\n"
        lines.append(line)
        for extra in after.get(key, ()):
            lines.append(extra.rstrip("\n") + "\n")
    wrong = {key: n for key, n in seen.items() if n != 1}
    if wrong:
        raise ShippedFileError("the shipped streamfl.conf must have each of these options once: %s"
                               % wrong)
    return "".join(lines)


def check_user_name(device: str) -> None:
    if not device or any(c.isspace() for c in device) or any(c in device for c in "+#/"):
        raise ShippedFileError("device id %r cannot be an ACL user name" % (device,))


def deployed_acl(shipped: str, devices: Sequence[str], header: str = "") -> str:
    """``shipped`` with its example device blocks (``EXAMPLE_DEVICES``: a ``user`` line and the
    lines up to the next blank line) replaced, where the first one stood, by one block of the
    same lines per device in ``devices``."""
    lines = shipped.splitlines(keepends=True)
    blocks = []  # (start, end) of each example block, end exclusive (the blank line stays)
    i = 0
    while i < len(lines):
        if lines[i].strip() in ("user %s" % name for name in EXAMPLE_DEVICES):
            j = i + 1
            while j < len(lines) and lines[j].strip():
                j += 1
            blocks.append((i, j))
            i = j
        else:
            i += 1
    if len(blocks) != len(EXAMPLE_DEVICES):
        raise ShippedFileError("the shipped acl must have the example device blocks %s, found %d"
                               % (", ".join(EXAMPLE_DEVICES), len(blocks)))
    start, end = blocks[0]
    body = lines[start + 1:end]
    if body and not body[-1].endswith("\n"):
        body[-1] += "\n"
    for device in devices:
        check_user_name(device)
    new = []
    for n, device in enumerate(devices):
        if n:
            new.append("\n")
        new.append("user %s\n" % device)
        new.extend(body)
    out = ([header] if header else []) + lines[:start] + new
    previous = end
    for s, e in blocks[1:]:
        between = lines[previous:s]
        # drop the blank line(s) that separated the removed blocks
        out.extend(line for line in between if line.strip())
        previous = e
    out.extend(lines[previous:])
    text = "".join(out)
    return text if text.endswith("\n") else text + "\n"


def pattern_lines(acl_text: str) -> List[str]:
    """The ``pattern`` lines of an ACL (what every account gets for its own name)."""
    return [line.strip() for line in acl_text.splitlines() if line.strip().startswith("pattern ")]


def fleet_conf(shipped: str, folder: Path, port: int, bind: Optional[str], certificate_auth: bool,
               fleet: str) -> str:
    """The fleet's mosquitto.conf: the shipped one with its paths in ``folder`` (the output's
    ``broker/``), the listener on ``port`` (``bind``: one address, else every interface) and, for
    certificate fleets, client certificates required and naming the client, checked against the
    CRL."""
    values: Dict[str, Optional[str]] = {
        "listener": str(port) + (" %s" % bind if bind else ""),
        "cafile": str(folder / "ca.crt"), "certfile": str(folder / "server.crt"),
        "keyfile": str(folder / "server.key"), "acl_file": str(folder / "acl"),
        "password_file": None if certificate_auth else str(folder / "passwd"),
        "persistence_location": "%s/" % (folder / "data"),
        "log_dest": "file %s" % (folder / "log" / "mosquitto.log"),
        "require_certificate": "true" if certificate_auth else "false",
    }
    after: Dict[str, List[str]] = {}
    if certificate_auth:
        after["require_certificate"] = ["use_identity_as_username true",
                                        "crlfile %s" % (folder / "crl.pem")]
    header = ("# Written by 'streamfl provision' for fleet %s from the shipped streamfl.conf: only "
              "the paths,\n# the listener and the client authentication differ. Re-run streamfl "
              "provision to change it.\n" % fleet)
    return deployed_conf(shipped, values, after, header)


def fleet_acl(shipped: str, boards: Iterable[str], fleet: str) -> str:
    """The fleet's ACL: the shipped one with one device block per (unrevoked) board."""
    header = ("# Written by 'streamfl provision' for fleet %s from the shipped acl: its example "
              "device blocks\n# are replaced by one block per board. Re-run streamfl provision to "
              "change it.\n" % fleet)
    return deployed_acl(shipped, list(boards), header)
