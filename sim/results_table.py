"""``streamfl report DIR --markdown``: a run's methods as a Markdown table, for docs/results.md.

One row per method: final accuracy, the run's mean accuracy (AdaCLP's "average accuracy over a
period"), fleet energy in kJ, each as mean ± standard deviation over seeds, and energy and mean
accuracy against a reference method (FedAsync by default, the paper's asynchronous baseline), so
tables in the docs are printed from ``summary.json`` rather than copied by hand.
"""
from pathlib import Path
from typing import Dict, List, Optional

from streamfl.errors import StreamflError
from streamfl.sim.run_files import read_summary

DEFAULT_REFERENCE = "fedasync"


def _pm(entry: Dict, key: str, scale: float = 1.0, pattern: str = "%.3f") -> str:
    mean, std = entry.get(key), entry.get(key + "_std")
    if mean is None:
        return "–"
    text = pattern % (mean * scale)
    return text if std is None else "%s ± %s" % (text, pattern % (std * scale))


def markdown_table(summary: Dict, reference: Optional[str] = DEFAULT_REFERENCE) -> str:
    """The methods of ``summary`` (a ``summary.json``) as a Markdown table; the two "vs" columns
    appear when ``reference`` is one of them."""
    methods = summary.get("methods") or {}
    if not methods:
        raise StreamflError("the run has no methods to tabulate")
    ref = methods.get(reference) if reference else None
    header = ["method", "final accuracy", "mean accuracy over the run", "energy (kJ)"]
    if ref is not None:
        header += ["mean accuracy vs `%s` (points)" % reference, "energy vs `%s`" % reference]
    rows: List[List[str]] = []
    for name, entry in methods.items():
        row = ["`%s`" % name, _pm(entry, "final_accuracy"), _pm(entry, "mean_accuracy"),
               _pm(entry, "energy_j", 1e-3, "%.1f")]
        if ref is not None:
            mean, ref_mean = entry.get("mean_accuracy"), ref.get("mean_accuracy")
            energy, ref_energy = entry.get("energy_j"), ref.get("energy_j")
            row.append("%+.1f" % (100 * (mean - ref_mean))
                       if mean is not None and ref_mean is not None else "–")
            row.append("%.2f" % (energy / ref_energy) if energy and ref_energy else "–")
        rows.append(row)
    lines = ["| %s |" % " | ".join(header), "|%s|" % "|".join("---" for _ in header)]
    lines += ["| %s |" % " | ".join(row) for row in rows]
    return "\n".join(lines)


def markdown_for_run(run_dir: Path, reference: Optional[str] = DEFAULT_REFERENCE) -> str:
    """The table of the run in ``run_dir``."""
    return markdown_table(read_summary(Path(run_dir) / "summary.json"), reference)
