"""Never leave a board throttled: save the original clock settings before the first change and
put them back on every way out.

The saved file (``<state>/dvfs-saved.json``) names each domain's driver, folder and original
values, so ``restore_saved`` needs nothing but the sysfs root: it serves a normal exit, the
unit's ``ExecStopPost`` (``streamfl-agent dvfs restore``) after a SIGKILL or OOM kill, and the next
start after a crash. The file is removed only once every domain was restored, so a failed restore
is retried by the next of those.
"""
import json
import logging
import os
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional

from streamfl.dvfs.base import DvfsBackend, DvfsError, SysfsIO
from streamfl.dvfs.cpufreq import CpufreqDomain
from streamfl.dvfs.devfreq import DevfreqDomain
from streamfl.errors import StorageError
from streamfl.fileio import atomic_write, read_if_present

log = logging.getLogger(__name__)

SAVED_FILE = "dvfs-saved.json"
FORMAT = 1
_DRIVERS = {"cpufreq": CpufreqDomain, "devfreq": DevfreqDomain}


def _saved_path(state_dir: Path) -> Path:
    return Path(state_dir) / SAVED_FILE


class DvfsGuard:
    """Applies level plans to a backend; the first change saves the originals, ``restore`` undoes.

    Domains with no sysfs folder (simulated ones) are restored from memory only: a crash loses
    nothing real there. Use as a context manager so an exception restores too.
    """

    def __init__(self, backend: DvfsBackend, state_dir: Optional[Path]):
        self.backend = backend
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self._saved: Optional[Dict[str, List]] = None

    @property
    def changed(self) -> bool:
        """True between the first change and a successful restore."""
        return self._saved is not None

    def apply(self, plan: Mapping[str, int]) -> Dict[str, int]:
        """Set each named domain to its level; returns the levels now in force for those domains.

        ``DvfsError`` if the originals cannot be saved (then nothing is changed) or a write fails.
        """
        if not plan:
            return {}
        if self._saved is None:
            self._save()
        applied = {}
        for name, level in plan.items():
            dom = self.backend.domain(name)
            if dom.current_level() != level:
                dom.set_level(level)
            applied[name] = level
        return applied

    def _save(self) -> None:
        """Write the originals before the first change; an earlier run's unrestored save wins.

        If ``dvfs-saved.json`` is still there (its restore failed at start, e.g. the GPU devfreq
        device had not appeared yet), the values in it are the board's true originals and the
        ones read now may be that run's lowered clocks: those domains keep the file's values, in
        the file and in memory, so every later restore puts the true originals back.
        """
        snapshot = self.backend.snapshot()
        if self.state_dir is not None:
            path = _saved_path(self.state_dir)
            earlier = self._earlier_save(path)
            entries = []
            for d in self.backend.domains:
                if not getattr(d, "directory", None):
                    continue
                old = earlier.get((d.driver, d.directory))
                if old is not None:
                    snapshot[d.name] = [tuple(pair) for pair in old["snapshot"]]
                    log.warning("keeping the original clocks of %s that an earlier run saved", d.name)
                entries.append({"name": d.name, "driver": d.driver, "dir": d.directory,
                                "snapshot": [list(pair) for pair in snapshot[d.name]]})
            kept = [e for key, e in earlier.items()
                    if key not in {(x["driver"], x["dir"]) for x in entries}]
            doc = {"format": FORMAT, "pid": os.getpid(), "saved_at": time.time(),
                   "domains": entries + kept}
            if doc["domains"]:
                try:
                    self.state_dir.mkdir(parents=True, exist_ok=True)
                    atomic_write(path, json.dumps(doc, indent=1).encode("utf-8"), sync_dir=True)
                except OSError as exc:
                    raise DvfsError("cannot save the original clocks to %s (%s); not changing any"
                                    % (path, exc.strerror or exc), exc.errno or 0) from None
                log.info("saved original clock settings of %d domain(s) to %s",
                         len(doc["domains"]), path)
        self._saved = snapshot

    @staticmethod
    def _earlier_save(path: Path) -> Dict[tuple, dict]:
        """Entries of a save file an earlier run left, by (driver, folder); ``DvfsError`` if it
        cannot be read, since changing clocks then could lose the true originals."""
        try:
            doc = json.loads(path.read_bytes().decode("utf-8"))
            if doc.get("format") != FORMAT:
                raise ValueError("format %r" % doc.get("format"))
            return {(e["driver"], str(e["dir"])): e for e in doc["domains"]}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DvfsError("%s from an earlier run cannot be read (%s); not changing any clock "
                            "until it is restored or removed" % (path, exc)) from None

    def restore(self) -> bool:
        """Put every domain back as it was before the first change; True if all went back."""
        if self._saved is None:
            return True
        failed = self.backend.restore(self._saved)
        if failed:
            log.error("could not restore the clocks of %s; the saved settings stay in %s for "
                      "'streamfl-agent dvfs restore'", ", ".join(failed),
                      _saved_path(self.state_dir) if self.state_dir else "memory")
            return False
        self._saved = None
        if self.state_dir is not None:
            try:
                _saved_path(self.state_dir).unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("clocks restored but %s could not be removed: %s",
                            _saved_path(self.state_dir), exc.strerror or exc)
        log.info("clocks restored to their original settings")
        return True

    def __enter__(self) -> "DvfsGuard":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def restore_saved(state_dir: Path, io: SysfsIO) -> Optional[List[str]]:
    """Restore what an earlier run saved; the names restored, or None when nothing was saved.

    ``DvfsError`` if some domain could not be restored (the file is kept for a later try);
    ``StorageError`` if the file is unreadable or not ours.
    """
    path = _saved_path(state_dir)
    raw = read_if_present(path)
    if raw is None:
        return None
    try:
        doc = json.loads(raw.decode("utf-8"))
        if doc.get("format") != FORMAT:
            raise ValueError("format %r" % doc.get("format"))
        entries = [(e["name"], _DRIVERS[e["driver"]], str(e["dir"]),
                    [(str(p), str(v)) for p, v in e["snapshot"]]) for e in doc["domains"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StorageError("%s is not a streamfl DVFS save file (%s); restore by hand or delete it"
                           % (path, exc)) from None
    restored, failed = [], []
    for name, cls, directory, snapshot in entries:
        try:
            cls(io, directory, name=name).restore(snapshot)
            restored.append(name)
        except DvfsError as exc:
            log.error("restoring %s failed: %s", name, exc)
            failed.append(name)
    if failed:
        raise DvfsError("could not restore %s; %s is kept" % (", ".join(failed), path))
    path.unlink()
    log.warning("restored the clocks an earlier run (pid %s) had changed: %s",
                doc.get("pid"), ", ".join(restored))
    return restored
