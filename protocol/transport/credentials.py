"""Broker password lookup: from a file (systemd credentials, a 0600 file) or the environment, never a flag."""
import os
from pathlib import Path
from typing import Mapping, Optional

from streamfl.errors import ConfigError

PASSWORD_ENV = "STREAMFL_MQTT_PASSWORD"


def read_password(password_file: Optional[Path], env_var: str = PASSWORD_ENV,
                  environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The MQTT password: ``password_file`` (trailing newline stripped) if given, else ``env_var``.

    ``ConfigError`` if the file cannot be read; None when neither is set. The password is never
    logged or put in an error message.
    """
    if password_file is not None:
        path = Path(password_file)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            raise ConfigError("cannot read MQTT password file %s: %s" % (path, reason)) from None
        return text.rstrip("\r\n")
    value = (os.environ if environ is None else environ).get(env_var)
    return value if value else None
