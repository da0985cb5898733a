"""A simulator run's methods as tables, from its ``summary.json``: HTML for ``streamfl report``'s
page, Markdown for ``streamfl report DIR --markdown`` (docs/results.md).

HTML (``methods_table``): one row per method, final accuracy, fleet energy and its training and
idle parts, time to each accuracy threshold and every further numeric figure of the summary, as
mean ± std over seeds.

Markdown (``markdown_table``): one row per method: final accuracy, the run's mean accuracy
(AdaCLP's "average accuracy over a period"), fleet energy and its training and idle parts in kJ,
each as mean ± standard deviation over seeds, and energy and mean accuracy against a reference
method (FedAsync by default, the paper's asynchronous baseline), so tables in the docs are printed
from ``summary.json`` rather than copied by hand.
"""
import html
import math
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from streamfl.errors import StreamflError
from streamfl.sim.summary import read_summary

DEFAULT_REFERENCE = "fedasync"
KNOWN_METHOD_KEYS = ("final_accuracy", "energy_j", "train_energy_j", "idle_energy_j",
                     "time_to_accuracy_s", "runs")


def is_number(x) -> bool:
    """Numbers for tables and axes: bools and NaN are not."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not (
        isinstance(x, float) and math.isnan(x))


def natural_key(text: str):
    """Sort ``dev2`` before ``dev10``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(text))]


def fmt_value(mean: Optional[float], std: Optional[float] = None) -> str:
    """``0.812 ± 0.010``: the precision follows the magnitude so mean and spread read alike."""
    if mean is None:
        return "–"
    scale = max(abs(mean), abs(std or 0.0))
    spec = ("%.0f" if scale >= 100 else "%.2f" if scale >= 1 else "%.3f" if scale >= 0.001
            or scale == 0 else "%.2e")
    return spec % mean if std is None else "%s ± %s" % (spec % mean, spec % std)


# ---- HTML, for the report page ------------------------------------------------------------------

def _thresholds(methods: Dict[str, Dict]) -> List[str]:
    """Time-to-accuracy keys present in any method, sorted as the numbers they spell."""
    def order(key: str) -> Tuple[float, str]:
        try:
            return float(key), key
        except ValueError:
            return math.inf, key
    return sorted({k for e in methods.values() for k in (e.get("time_to_accuracy_s") or {})}, key=order)


def _extra_keys(methods: Dict[str, Dict]) -> List[str]:
    """Numeric per-method keys beyond the known ones, first seen first; ``K_std`` pairs with ``K``."""
    seen: List[str] = []
    for entry in methods.values():
        seen += [k for k, v in entry.items() if k not in KNOWN_METHOD_KEYS and k not in seen
                 and is_number(v) and not (k.endswith("_std") and k[:-4] in entry)]
    return seen


def _cell(entry: Dict, key: str, n_seeds: int) -> str:
    """A method's value of ``key`` as mean ± std; the std comes from ``K_std`` or else the runs."""
    value = entry.get(key)
    if not is_number(value):
        return "–"
    if n_seeds <= 1:
        return fmt_value(value)
    std = entry.get(key + "_std")
    if not is_number(std):
        runs = [r.get(key) for r in entry.get("runs") or [] if isinstance(r, dict)]
        runs = [r for r in runs if is_number(r)]
        std = float(np.std(runs)) if runs else None  # population std, ddof 0
    return fmt_value(value, std)


def _t2a_cell(entry: Dict, key: str, n_seeds: int) -> str:
    """Time to a threshold: mean ± std over the seeds that reached it, and how many did."""
    value = (entry.get("time_to_accuracy_s") or {}).get(key)
    if not is_number(value):
        return "not reached"
    runs = [r for r in entry.get("runs") or [] if isinstance(r, dict)]
    reached = [(r.get("time_to_accuracy_s") or {}).get(key) for r in runs]
    reached = [t for t in reached if is_number(t)]
    text = fmt_value(value, float(np.std(reached)) if n_seeds > 1 and len(reached) > 1 else None)
    if runs and len(reached) < len(runs):
        text += " (%d/%d seeds)" % (len(reached), len(runs))
    return text


def html_table(header: List[str], rows: List[List[str]]) -> str:
    """An HTML table; every cell is escaped here."""
    head = "".join("<th>%s</th>" % html.escape(h) for h in header)
    body = "".join("<tr>%s</tr>" % "".join("<td>%s</td>" % html.escape(c) for c in row) for row in rows)
    return "<table><thead><tr>%s</tr></thead><tbody>%s</tbody></table>" % (head, body)


def markdown_rows(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table (cells as given: they hold no pipes)."""
    lines = ["| %s |" % " | ".join(header), "|%s|" % "|".join("---" for _ in header)]
    return "\n".join(lines + ["| %s |" % " | ".join(row) for row in rows])


def methods_table(summary: Dict) -> str:
    """Methods × metrics, mean ± std over seeds, as an HTML table."""
    methods = summary.get("methods", {})
    t2a, extras = _thresholds(methods), _extra_keys(methods)
    header = (["method", "final accuracy", "fleet energy (J)", "training energy (J)",
               "idle energy (J)"]
              + ["time to %s accuracy (s)" % k for k in t2a] + extras)
    rows = []
    for name, entry in methods.items():
        n = len(entry.get("runs") or []) or len(summary.get("seeds") or [])
        rows.append([name, _cell(entry, "final_accuracy", n), _cell(entry, "energy_j", n),
                     _cell(entry, "train_energy_j", n), _cell(entry, "idle_energy_j", n)]
                    + [_t2a_cell(entry, k, n) for k in t2a] + [_cell(entry, k, n) for k in extras])
    failed = failed_runs(summary)
    note = ("<p>Failed runs, left out of the figures:</p><ul>%s</ul>"
            % "".join("<li>%s</li>" % html.escape(f) for f in failed)) if failed else ""
    return html_table(header, rows) + note


# ---- Markdown, for docs/results.md --------------------------------------------------------------

def _pm(entry: Dict, key: str, scale: float = 1.0, pattern: str = "%.3f") -> str:
    mean, std = entry.get(key), entry.get(key + "_std")
    if mean is None:
        return "–"
    text = pattern % (mean * scale)
    return text if std is None else "%s ± %s" % (text, pattern % (std * scale))


def _target(summary: Dict) -> Optional[str]:
    """The accuracy the energy-to-target column uses: the highest threshold every method reached
    (in some seed), else the highest any did; None for runs from before the figure existed."""
    entries = list((summary.get("methods") or {}).values())
    reached = [{t for t, v in (e.get("energy_to_accuracy_j") or {}).items() if v is not None}
               for e in entries]
    every = set.intersection(*reached) if reached else set()
    found = every or set().union(*reached) if reached else set()
    return max(found, key=float) if found else None


def markdown_table(summary: Dict, reference: Optional[str] = DEFAULT_REFERENCE,
                   rows: Optional[List[str]] = None) -> str:
    """The methods of ``summary`` (a ``summary.json``) as a Markdown table (``rows``: only those,
    in that order); the two "vs" columns appear when ``reference`` is one of the run's methods."""
    every = summary.get("methods") or {}
    methods = every if rows is None else {m: every[m] for m in rows if m in every}
    if not methods:
        raise StreamflError("the run has no methods to tabulate")
    ref = every.get(reference) if reference else None
    target = _target(summary)
    header = ["method", "final accuracy", "mean accuracy over the run", "energy (kJ)",
              "training energy (kJ)", "idle energy (kJ)"]
    if target is not None:
        header.append("energy to %s accuracy (kJ, seeds reaching it)" % target)
    if ref is not None:
        header += ["mean accuracy vs `%s` (points)" % reference, "energy vs `%s`" % reference]
    rows: List[List[str]] = []
    for name, entry in methods.items():
        row = ["`%s`" % name, _pm(entry, "final_accuracy"), _pm(entry, "mean_accuracy"),
               _pm(entry, "energy_j", 1e-3, "%.1f"), _pm(entry, "train_energy_j", 1e-3, "%.1f"),
               _pm(entry, "idle_energy_j", 1e-3, "%.1f")]
        if target is not None:
            joules = (entry.get("energy_to_accuracy_j") or {}).get(target)
            reached = (entry.get("reached") or {}).get(target, 0)
            row.append("–" if joules is None else "%.1f (%d/%d)" % (joules * 1e-3, reached,
                                                                    entry.get("seeds", 0)))
        if ref is not None:
            mean, ref_mean = entry.get("mean_accuracy"), ref.get("mean_accuracy")
            energy, ref_energy = entry.get("energy_j"), ref.get("energy_j")
            row.append("%+.1f" % (100 * (mean - ref_mean))
                       if mean is not None and ref_mean is not None else "–")
            row.append("%.2f" % (energy / ref_energy) if energy and ref_energy else "–")
        rows.append(row)
    return markdown_rows(header, rows) + failed_note(summary)


def failed_runs(summary: Dict) -> List[str]:
    """Each run of a ``--keep-going`` grid that failed, as ``method seed N: error``."""
    return ["%s seed %s: %s" % (name, f.get("seed"), f.get("error"))
            for name, entry in (summary.get("methods") or {}).items()
            for f in entry.get("failed") or []]


def failed_note(summary: Dict) -> str:
    """A line under a table naming the runs its figures leave out ("" when none failed): a mean
    over fewer seeds than the grid's must say so."""
    failed = failed_runs(summary)
    return "\n\nFailed runs, left out of the figures: %s." % "; ".join(failed) if failed else ""


def markdown_for_run(run_dir: Path, reference: Optional[str] = DEFAULT_REFERENCE,
                     rows: Optional[List[str]] = None) -> str:
    """The Markdown table of the run in ``run_dir`` (``rows``: only those methods)."""
    return markdown_table(read_summary(Path(run_dir) / "summary.json"), reference, rows)
