"""Writing the output's files with the modes their readers accept, and the ``mosquitto`` user.

Private keys and passwords are 0600 (the CA's key in a 0700 ``ca/`` folder); certificates, configs
and public keys 0644. A file written once (a key, a password, a certificate) is never written
again: a re-run finds it and keeps it byte for byte (``Files.once``); configs are rewritten only
when their text changes (``Files.always``).

mosquitto started as root drops to the user ``mosquitto`` (its ``user`` option's default) before
it reads the password file and the ACL and writes its database and log, and mosquitto 2.0.16 and
later warn about (and later releases refuse) a password file or ACL that user does not own. So the
files it reads are owned by ``mosquitto`` when provisioning runs as root and that user exists
(``chown_broker``); otherwise ``chown_commands`` says, word for word, what to run.
"""
import logging
import os
import stat
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple, Union

from streamfl.errors import ConfigError
from streamfl.fileio import atomic_write

log = logging.getLogger(__name__)

#: The user mosquitto drops to when started as root (Debian's package creates it).
MOSQUITTO_USER = "mosquitto"
SECRET_MODE = 0o600
PUBLIC_MODE = 0o644
PRIVATE_DIR_MODE = 0o700
DIR_MODE = 0o755

Data = Union[bytes, Callable[[], bytes]]


class Files:
    """Writes under one root and remembers what it made, kept and changed."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.created: List[Path] = []
        self.kept: List[Path] = []
        self.changed: List[Path] = []

    def folder(self, path: Path, mode: int = DIR_MODE) -> Path:
        path = Path(path)
        try:
            path.mkdir(parents=True, exist_ok=True)
            if stat.S_IMODE(path.stat().st_mode) != mode:
                path.chmod(mode)
        except OSError as exc:
            raise ConfigError("cannot make folder %s: %s" % (path, exc.strerror or exc)) from None
        return path

    def once(self, path: Path, data: Data, mode: int) -> bytes:
        """The file's bytes: kept as they are if it exists (its mode set to ``mode`` if it is
        looser), else written with ``data`` (bytes, or a function making them)."""
        path = Path(path)
        try:
            existing = path.read_bytes()
        except FileNotFoundError:
            existing = None
        except OSError as exc:
            raise ConfigError("cannot read %s: %s" % (path, exc.strerror or exc)) from None
        if existing is not None:
            self.kept.append(path)
            self._tighten(path, mode)
            return existing
        payload = data() if callable(data) else data
        try:
            fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
            os.chmod(str(path), mode)  # not narrowed by the umask
        except OSError as exc:
            raise ConfigError("cannot write %s: %s" % (path, exc.strerror or exc)) from None
        self.created.append(path)
        return payload

    def always(self, path: Path, data: bytes, mode: int) -> None:
        """Write ``data`` unless the file already holds exactly it; set its mode."""
        path = Path(path)
        try:
            same = path.exists() and path.read_bytes() == data
            if not same:
                new = not path.exists()
                atomic_write(path, data)
                (self.created if new else self.changed).append(path)
            os.chmod(str(path), mode)
        except OSError as exc:
            raise ConfigError("cannot write %s: %s" % (path, exc.strerror or exc)) from None

    def _tighten(self, path: Path, mode: int) -> None:
        current = stat.S_IMODE(path.stat().st_mode)
        if current & ~mode:
            log.warning("%s was mode %o: set to %o", path, current, mode)
            os.chmod(str(path), mode)


def mosquitto_ids(user: str = MOSQUITTO_USER) -> Optional[Tuple[int, int]]:
    """``(uid, gid)`` of the ``mosquitto`` user, or None where there is none."""
    try:
        import pwd
        entry = pwd.getpwnam(user)
    except (ImportError, KeyError):
        return None
    return entry.pw_uid, entry.pw_gid


def running_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def chown_broker(paths: Sequence[Path], ids: Tuple[int, int]) -> None:
    """Give ``paths`` (files and folders mosquitto reads or writes) to the mosquitto user."""
    for path in paths:
        os.chown(str(path), ids[0], ids[1])


def chown_commands(paths: Sequence[Path], user: str = MOSQUITTO_USER) -> List[str]:
    """The commands that give ``paths`` to ``user``, for a broker started as root."""
    return ["sudo chown %s:%s %s" % (user, user, " ".join(str(p) for p in paths))]


def unreachable_by(path: Path, uid: int, gid: int) -> Optional[Path]:
    """The first folder above ``path`` that user ``uid`` (group ``gid``) may not enter, or None."""
    for folder in reversed(Path(path).resolve().parents):
        try:
            st = folder.stat()
        except OSError:
            return folder
        mode = st.st_mode
        if st.st_uid == uid:
            ok = mode & stat.S_IXUSR
        elif st.st_gid == gid:
            ok = mode & stat.S_IXGRP
        else:
            ok = mode & stat.S_IXOTH
        if not ok:
            return folder
    return None
