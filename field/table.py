#!/usr/bin/env python3
"""The markdown table of a field lab run (its ``summary.json``), as docs/field.md shows it.

    python field/table.py runs/field/<time>/summary.json
"""
import json
import sys
from pathlib import Path


def _counted(rec):
    counted = rec.get("counted") or {}
    return ", ".join("%s %d" % (k, v) for k, v in sorted(counted.items())) or "0"


def _acc(value):
    return "-" if value is None else "%.3f" % value


def table(summary: dict) -> str:
    head = ("| scenario | ok | acknowledged | aggregated | counted by reason | lost | versions "
            "(fault -> last) | resets | accuracy before -> after | clocks restored | failures |")
    lines = [head, "|" + "---|" * 11]
    for rec in summary["records"]:
        v = rec.get("versions") or {}
        lines.append("| `%s` | %s | %s | %s | %s | %s | %s -> %s | %s | %s -> %s | %s | %s |" % (
            rec["scenario"], "yes" if rec.get("ok") else "**no**", rec.get("acknowledged", "-"),
            rec.get("aggregated", "-"), _counted(rec), rec.get("lost", "-"), v.get("at_fault", "-"),
            v.get("last", "-"), rec.get("resets", "-"), _acc(rec.get("accuracy_before")),
            _acc(rec.get("accuracy_after")),
            "yes" if rec.get("clocks_restored") else "**no**",
            "; ".join(rec.get("failures") or []).replace("|", "/") or "-"))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    sys.stdout.write(table(json.loads(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
