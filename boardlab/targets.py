"""The board userlands the lab proves the install on: a Debian suite, its Python and a board."""
from dataclasses import dataclass
from typing import Dict, Tuple


@dataclass(frozen=True)
class Target:
    """One board OS: the ``make dist`` target name, the Debian suite its root is built from, the
    Python that suite ships, the board profile whose fake sysfs tree the agent runs on, and the
    core qemu emulates (``QEMU_CPU``) for everything run in the root."""

    name: str
    suite: str
    python: str
    board: str
    what: str
    qemu_cpu: str = "cortex-a72"

    @property
    def cache_name(self) -> str:
        return "%s-arm64" % self.suite


#: Raspberry Pi OS bookworm is built on Debian 12 (its Python 3.11); Raspberry Pi OS bullseye and
#: Debian 11 ship Python 3.9. Both run as a Raspberry Pi 4, the board both OSes run on, on its
#: Cortex-A72: qemu's default core ("max") has every later extension, the ARMv8.1 atomics a Pi 4
#: (and a Pi 3's A53) lacks among them, and would pass a torch that dies there with "Illegal
#: instruction" (torch 2.10's arm64 wheel does).
TARGETS: Tuple[Target, ...] = (
    Target("rpios-bookworm-aarch64", "bookworm", "3.11", "raspberry-pi-4",
           "Raspberry Pi OS bookworm / Debian 12, arm64", "cortex-a72"),
    Target("debian-bullseye-aarch64", "bullseye", "3.9", "raspberry-pi-4",
           "Raspberry Pi OS bullseye / Debian 11, arm64", "cortex-a72"),
)
BY_NAME: Dict[str, Target] = {t.name: t for t in TARGETS}
