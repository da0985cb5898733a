"""mosquitto password file lines (``$7$``: PBKDF2-SHA512), made and checked in Python so that
provisioning needs no ``mosquitto_passwd`` and keeps the lines of accounts it does not change.

The format is mosquitto 2's own (``mosquitto_passwd -U`` writes the same): ``user:$7$<iterations>$
<base64 salt>$<base64 PBKDF2-HMAC-SHA512 of the password, 64 bytes>``, with a 12-byte salt.
"""
import base64
import binascii
import hashlib
import hmac
import secrets
from typing import Dict, Optional

#: PBKDF2 rounds: mosquitto_passwd's own default. The passwords made here are random 16-byte
#: tokens (128 bits), which no count of rounds makes easier or harder to guess; a higher count
#: would only cost the broker time on every connect.
PBKDF2_ITERATIONS = 101
#: Salt bytes, as mosquitto_passwd makes them.
SALT_BYTES = 12
#: Random bytes of a generated password (printed as 22 URL-safe characters).
PASSWORD_BYTES = 16


def new_password() -> str:
    """A random password: 128 bits, URL-safe characters (no ``:`` and no whitespace)."""
    return secrets.token_urlsafe(PASSWORD_BYTES)


def hash_line(user: str, password: str, salt: Optional[bytes] = None,
              iterations: int = PBKDF2_ITERATIONS) -> str:
    """One password file line (no newline) for ``user``."""
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, iterations, 64)
    return "%s:$7$%d$%s$%s" % (user, iterations, base64.b64encode(salt).decode("ascii"),
                               base64.b64encode(digest).decode("ascii"))


def line_matches(line: str, password: str) -> bool:
    """True if the password file ``line`` holds a ``$7$`` hash of ``password``."""
    _, _, hashed = line.strip().partition(":")
    parts = hashed.split("$")
    if len(parts) != 5 or parts[1] != "7" or not parts[2].isdigit():
        return False
    try:
        salt, want = base64.b64decode(parts[3]), base64.b64decode(parts[4])
    except (binascii.Error, ValueError):
        return False
    got = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, int(parts[2]), len(want))
    return hmac.compare_digest(got, want)


def parse_file(text: str) -> Dict[str, str]:
    """``{user: line}`` of a password file's text (comments and blank lines left out)."""
    out = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#") and ":" in line:
            out[line.split(":", 1)[0]] = line.rstrip("\n")
    return out


def password_file(passwords: Dict[str, str], previous: str = "") -> str:
    """The password file for ``{user: password}``: a user whose line in ``previous`` still matches
    its password keeps that line byte for byte (a re-run re-hashes nothing); the others get new."""
    old = parse_file(previous)
    lines = []
    for user, password in passwords.items():
        line = old.get(user)
        lines.append(line if line is not None and line_matches(line, password)
                     else hash_line(user, password))
    return "".join(line + "\n" for line in lines)
