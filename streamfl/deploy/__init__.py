"""Getting the agent onto boards: ``make dist``'s wheelhouses (``dist``) and the board install script.

``install_board.sh`` ships in this package (package data) so that ``streamfl provision`` can put it
into every board kit and ``make dist`` beside every wheelhouse; ``install_script()`` copies it out
(``importlib.resources.files("streamfl.deploy") / "install_board.sh"`` on Python 3.9+, or
``importlib.resources.path`` on 3.8, reach it too). ``pkgutil.get_data`` reads it here: it works on
3.8 and, unlike ``importlib.resources.read_text``, is not deprecated on 3.11 and 3.12.
"""
import os
import pkgutil
from pathlib import Path

#: The script's name in this package, in each wheelhouse and in each kit.
INSTALL_SCRIPT = "install_board.sh"


def install_script_text() -> str:
    """The board install script's text, as shipped in the installed package."""
    data = pkgutil.get_data(__name__, INSTALL_SCRIPT)
    if data is None:  # a loader that cannot read package data
        raise FileNotFoundError("%s: %s is not readable from the installed package" % (__name__, INSTALL_SCRIPT))
    return data.decode("utf-8")


def install_script(dest_dir: Path) -> Path:
    """Write the board install script into ``dest_dir`` (mode 0755); its path. A new file renamed
    over the old one: a shell running the old script keeps reading the file it opened."""
    dest = Path(dest_dir) / INSTALL_SCRIPT
    tmp = dest.with_name("." + INSTALL_SCRIPT + ".new")
    tmp.write_text(install_script_text(), encoding="utf-8")
    os.chmod(str(tmp), 0o755)
    os.replace(str(tmp), str(dest))
    return dest
