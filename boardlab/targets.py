"""The board userlands the lab proves the install on: a Debian suite, its Python and a board."""
from dataclasses import dataclass
from typing import Dict, Tuple


@dataclass(frozen=True)
class Target:
    """One board OS: the ``make dist`` target name, the Debian suite its root is built from, the
    Python that suite ships, and the board profile whose fake sysfs tree the agent runs on."""

    name: str
    suite: str
    python: str
    board: str
    what: str

    @property
    def cache_name(self) -> str:
        return "%s-arm64" % self.suite


#: Raspberry Pi OS bookworm is built on Debian 12 (its Python 3.11); Raspberry Pi OS bullseye and
#: Debian 11 ship Python 3.9. Each runs on the Pi generation that shipped with it.
TARGETS: Tuple[Target, ...] = (
    Target("rpios-bookworm-aarch64", "bookworm", "3.11", "raspberry-pi-5",
           "Raspberry Pi OS bookworm / Debian 12, arm64"),
    Target("debian-bullseye-aarch64", "bullseye", "3.9", "raspberry-pi-4",
           "Raspberry Pi OS bullseye / Debian 11, arm64"),
)
BY_NAME: Dict[str, Target] = {t.name: t for t in TARGETS}
