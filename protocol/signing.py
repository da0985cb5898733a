"""Ed25519 signatures on what only the coordinator may say, so a frame is not trusted because it parses.

The coordinator signs every global model and command it publishes; an agent that pins the
coordinator's public key (``coordinator_public_key`` in its YAML) drops unsigned and badly signed
ones. A signed payload is an envelope around an ordinary frame::

    b"SFS" + version byte (1) + 64-byte Ed25519 signature + frame

The signature covers ``CONTEXT + topic + b"\\n" + frame``: binding the topic means a command signed
for one device cannot be replayed on another device's command topic, nor a model of one fleet in
another. Replays of a command on its own topic are caught by the command's ``(run_id, seq)``, which
the frame carries and the signature covers.

Keys: ``generate_key_pair`` makes a private key (PKCS#8 PEM, kept by the coordinator, mode 0600)
and its public key written as ``ed25519:<base64 of the 32 raw bytes>``, one line to paste into
each agent's config. The ``cryptography`` package does the curve work.

Operators sign their commands to the coordinator the same way, each with a key of their own
(``streamfl operator --signing-key-file``); the coordinator pins their public keys
(``operator.public_keys``) and opens those with ``make_multi_verifier`` (any one of the keys).

Without a key (trial set-ups) ``NullSigner`` sends plain frames and ``NullVerifier`` accepts both
plain and signed payloads (the signature then goes unchecked): everything works, nothing is
authenticated beyond the broker's ACL.
"""
import base64
import logging
import os
import stat
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Optional, Sequence, Tuple

from streamfl.errors import ConfigError, ProtocolError

log = logging.getLogger(__name__)

ENVELOPE_MAGIC = b"SFS\x01"
SIGNATURE_BYTES = 64
ENVELOPE_BYTES = len(ENVELOPE_MAGIC) + SIGNATURE_BYTES
#: Domain separation: these signatures mean "a streamfl frame on this topic", nothing else.
CONTEXT = b"streamfl signed frame v1\n"
PUBLIC_KEY_PREFIX = "ed25519:"
#: The ``ProtocolError`` reasons a verifier raises (an agent counts each).
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad_signature"


def _signed_bytes(topic: str, frame: bytes) -> bytes:
    return b"".join((CONTEXT, topic.encode("utf-8"), b"\n", frame))


def is_signed(payload: bytes) -> bool:
    """True if ``payload`` is a signature envelope (whether or not the signature is good)."""
    return bytes(payload[:len(ENVELOPE_MAGIC)]) == ENVELOPE_MAGIC


class FrameSigner(ABC):
    """Turns a frame for a topic into the payload to publish."""

    @abstractmethod
    def sign(self, topic: str, frame: bytes) -> bytes:
        """The payload to publish on ``topic`` for ``frame``."""


class NullSigner(FrameSigner):
    """No key configured: frames go out as they are."""

    def sign(self, topic: str, frame: bytes) -> bytes:
        return frame


class Ed25519Signer(FrameSigner):
    """Signs with the coordinator's private key."""

    def __init__(self, private_key):
        self._key = private_key

    @classmethod
    def from_file(cls, path) -> "Ed25519Signer":
        return cls(load_private_key(path))

    def sign(self, topic: str, frame: bytes) -> bytes:
        return b"".join((ENVELOPE_MAGIC, self._key.sign(_signed_bytes(topic, frame)), frame))


class FrameVerifier(ABC):
    """Turns a received payload back into a frame, or refuses it."""

    #: True if a refusal here means a frame was unsigned or forged (counted as such).
    authenticates = False

    @abstractmethod
    def open(self, topic: str, payload: bytes) -> bytes:
        """The frame inside ``payload``; ``ProtocolError(UNSIGNED | BAD_SIGNATURE)`` if refused."""


class NullVerifier(FrameVerifier):
    """No key pinned: plain frames pass, signed ones are unwrapped without a check."""

    def open(self, topic: str, payload: bytes) -> bytes:
        if is_signed(payload):
            return bytes(payload[ENVELOPE_BYTES:])
        return payload


class Ed25519Verifier(FrameVerifier):
    """Accepts only payloads signed by the pinned coordinator key for this very topic."""

    authenticates = True

    def __init__(self, public_key):
        self._key = public_key

    def open(self, topic: str, payload: bytes) -> bytes:
        from cryptography.exceptions import InvalidSignature
        if not is_signed(payload):
            raise ProtocolError(UNSIGNED, "unsigned frame on %s" % topic)
        if len(payload) < ENVELOPE_BYTES:
            raise ProtocolError(BAD_SIGNATURE, "truncated signature envelope on %s" % topic)
        view = memoryview(payload)
        signature = bytes(view[len(ENVELOPE_MAGIC):ENVELOPE_BYTES])
        frame = bytes(view[ENVELOPE_BYTES:])
        try:
            self._key.verify(signature, _signed_bytes(topic, frame))
        except InvalidSignature:
            raise ProtocolError(BAD_SIGNATURE, "bad signature on %s" % topic) from None
        return frame


class Ed25519AnyVerifier(FrameVerifier):
    """Accepts payloads signed for this very topic by any one of several pinned keys (the
    coordinator's operators, each with a key of their own)."""

    authenticates = True

    def __init__(self, public_keys: Sequence):
        if not public_keys:
            raise ValueError("Ed25519AnyVerifier needs at least one key")
        self._verifiers = [Ed25519Verifier(key) for key in public_keys]

    def open(self, topic: str, payload: bytes) -> bytes:
        error: Optional[ProtocolError] = None
        for verifier in self._verifiers:
            try:
                return verifier.open(topic, payload)
            except ProtocolError as exc:
                if exc.reason == UNSIGNED:
                    raise
                error = exc
        assert error is not None
        raise error


def make_verifier(public_key: Optional[str]) -> FrameVerifier:
    """The verifier for an agent's ``coordinator_public_key`` (None: no check)."""
    if not public_key:
        return NullVerifier()
    return Ed25519Verifier(parse_public_key(public_key))


def make_multi_verifier(public_keys: Sequence[str], what: str = "operator.public_keys") -> FrameVerifier:
    """The verifier for a list of pinned keys (any one signs); ``NullVerifier`` for none."""
    if not public_keys:
        return NullVerifier()
    return Ed25519AnyVerifier([parse_public_key(key, what="%s[%d]" % (what, i))
                               for i, key in enumerate(public_keys)])


def make_signer(private_key_file: Optional[str]) -> FrameSigner:
    """The signer for a coordinator's ``signing_key_file`` (None: unsigned)."""
    if not private_key_file:
        return NullSigner()
    return Ed25519Signer.from_file(private_key_file)


# ---- keys ------------------------------------------------------------------------------------

def parse_public_key(text: str, what: str = "coordinator_public_key"):
    """An Ed25519 public key from ``ed25519:<base64>``; ConfigError (naming the key ``what``) if it
    is not one."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    value = str(text).strip()
    if not value.startswith(PUBLIC_KEY_PREFIX):
        raise ConfigError("%s must look like %s<base64> (from "
                          "'streamfl-coordinator keygen'), got %r" % (what, PUBLIC_KEY_PREFIX, value[:20]))
    try:
        raw = base64.b64decode(value[len(PUBLIC_KEY_PREFIX):], validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as exc:
        raise ConfigError("%s is not an Ed25519 public key: %s" % (what, exc)) from None


def public_key_text(private_key) -> str:
    """The ``ed25519:<base64>`` line of a private key's public half."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    raw = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return PUBLIC_KEY_PREFIX + base64.b64encode(raw).decode("ascii")


def load_private_key(path):
    """The coordinator's Ed25519 private key from a PEM file; ConfigError if unreadable or not one."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    path = Path(path)
    try:
        data = path.read_bytes()
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError("cannot read signing key %s: %s" % (path, exc.strerror or exc)) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("signing key %s is readable by other users (mode %o): chmod 600 it", path,
                    stat.S_IMODE(mode))
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError("%s is not an unencrypted PEM private key: %s" % (path, exc)) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError("%s holds a %s key, not Ed25519" % (path, type(key).__name__))
    return key


def generate_key_pair(directory, name: str = "coordinator-signing") -> Tuple[Path, Path, str]:
    """Write ``<name>.key`` (private, 0600) and ``<name>.pub`` in ``directory``; never overwrites.

    Returns the two paths and the public key line for the agents' configs.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
    directory = Path(directory)
    key_path, pub_path = directory / (name + ".key"), directory / (name + ".pub")
    for path in (key_path, pub_path):
        if path.exists():
            raise ConfigError("%s exists: refusing to overwrite a key (move it away first)" % path)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    public = public_key_text(key)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(str(key_path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
        pub_path.write_text(public + "\n", encoding="ascii")
    except OSError as exc:
        raise ConfigError("cannot write keys in %s: %s" % (directory, exc.strerror or exc)) from None
    return key_path, pub_path, public


__all__ = ["ENVELOPE_MAGIC", "ENVELOPE_BYTES", "UNSIGNED", "BAD_SIGNATURE", "FrameSigner",
           "NullSigner", "Ed25519Signer", "FrameVerifier", "NullVerifier", "Ed25519Verifier",
           "Ed25519AnyVerifier", "make_signer", "make_verifier", "make_multi_verifier",
           "parse_public_key", "public_key_text", "load_private_key", "generate_key_pair", "is_signed"]
