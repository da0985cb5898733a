"""Raspberry Pi 5 rail power from the PMIC's ADCs through ``vcgencmd pmic_read_adc``.

The firmware prints one current line (``VDD_CORE_A current(7)=6.22421000A``) and one voltage line
(``VDD_CORE_V volt(15)=0.86173300V``) per rail; the channel numbers of the two differ, so lines are
paired by rail name, not by index. Power per rail is A x V.
"""
import logging
import re
import subprocess
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from streamfl.dvfs.power.base import PowerError, PowerMeter

log = logging.getLogger(__name__)

#: ``pmic_read_adc`` costs about 23 ms of firmware time; a read past this is a hung mailbox.
DEFAULT_TIMEOUT_S = 2.0
DEFAULT_COMMAND = ("vcgencmd", "pmic_read_adc")

_LINE = re.compile(
    r"^\s*(?P<rail>\S+)_(?P<kind>[AV])\s+(?P<word>current|volt)\((?P<channel>\d+)\)="
    r"(?P<value>\S+?)(?P<unit>[AV])\s*$")

Runner = Callable[[List[str]], str]


def run_command(argv: List[str], timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """Run ``argv`` and return its stdout; raises ``OSError``, ``TimeoutExpired`` or
    ``CalledProcessError``, which the meter translates."""
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout_s, check=True, universal_newlines=True)
    return done.stdout


def parse_pmic_adc(text: str) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Amps and volts by rail name (``VDD_CORE``) from ``pmic_read_adc`` output.

    Lines of another shape are ignored (the firmware may add some); a line of the right shape whose
    number does not parse raises ``PowerError``.
    """
    amps: Dict[str, float] = {}
    volts: Dict[str, float] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if not match:
            if line.strip():
                log.debug("ignoring pmic_read_adc line %r", line)
            continue
        kind, word, unit = match.group("kind"), match.group("word"), match.group("unit")
        if (kind == "A") != (word == "current") or kind != unit:
            raise PowerError("inconsistent pmic_read_adc line %r" % line.strip())
        try:
            value = float(match.group("value"))
        except ValueError:
            raise PowerError("pmic_read_adc line %r holds no number" % line.strip()) from None
        (amps if kind == "A" else volts)[match.group("rail")] = value
    return amps, volts


class Rpi5PmicMeter(PowerMeter):
    """Watts per PMIC rail of a Raspberry Pi 5; ``runner`` runs the command (injectable for tests)."""

    kind = "rpi5-pmic"

    def __init__(self, runner: Optional[Runner] = None, command: Sequence[str] = DEFAULT_COMMAND,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self._command = list(command)
        self._timeout_s = timeout_s
        self._runner = runner if runner is not None else self._run_default
        # One read now: fails early where vcgencmd or the PMIC ADC is missing (Pi 4), fixes the rails.
        self._rails = tuple(self.read_w())
        log.debug("pmic rails: %s", ", ".join(self._rails))

    def _run_default(self, argv: List[str]) -> str:
        return run_command(argv, self._timeout_s)

    def _output(self) -> str:
        """The command's output; every way it can fail becomes a ``PowerError``."""
        shown = " ".join(self._command)
        try:
            return self._runner(list(self._command))
        except subprocess.TimeoutExpired:
            raise PowerError("%s did not answer within %.1f s" % (shown, self._timeout_s)) from None
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or exc.stdout or "").strip()[:200]
            raise PowerError("%s exited with %s: %s" % (shown, exc.returncode, detail)) from None
        except FileNotFoundError as exc:
            raise PowerError("%s not found: vcgencmd ships with Raspberry Pi OS (package "
                             "raspi-utils or libraspberrypi-bin)" % self._command[0],
                             exc.errno or 0) from exc
        except OSError as exc:
            raise PowerError("cannot run %s: %s (the agent's user needs the video group for "
                             "/dev/vcio)" % (shown, exc.strerror or exc), exc.errno or 0) from exc

    @property
    def rails(self) -> Tuple[str, ...]:
        return self._rails

    def read_w(self) -> Dict[str, float]:
        """A x V for every rail with both a current and a voltage line (``EXT5V``, ``BATT``: voltage
        only, so no power)."""
        text = self._output()
        amps, volts = parse_pmic_adc(text)
        watts = {rail: amps[rail] * volts[rail] for rail in amps if rail in volts}
        if not watts:
            raise PowerError("no rail with both current and voltage in %s output: %r"
                             % (" ".join(self._command), text.strip()[:200]))
        return watts

    def total_w(self) -> float:
        """The sum of the PMIC rails.

        The PMIC has no rail for the 5 V input: ``EXT5V_V`` is a voltage without a current, so the
        input power cannot be measured. The sum covers the board's own rails and leaves out the
        USB and peripheral 5 V draw, as Zeus documents.
        """
        return sum(self.read_w().values())
