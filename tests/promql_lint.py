"""What the PromQL the project ships (alert rules, the Grafana board) asks of /metrics: the metric
names it uses, and those it takes a counter's rate of or a gauge's slope of; and /metrics' own
metric names and types, as Prometheus' parser reads a scrape. Shared by the rules' and the board's
tests, so a metric renamed or retyped in the coordinator's collector breaks both."""
import os
import re
import shutil
from typing import Dict, Iterable, List, Set, Tuple

import pytest

#: Names of streamfl's metrics in an expression or a text (also inside an annotation).
STREAMFL_NAME = re.compile(r"\bstreamfl_[a-z0-9_]+\b")
#: A counter's functions, and the metric (a bare selector) they are applied to.
COUNTER_FUNCTION = re.compile(r"\b(rate|irate|increase|resets)\s*\(\s*([A-Za-z_][A-Za-z0-9_:]*)")
#: A gauge's slope and difference functions, which read a counter's reset as a fall.
GAUGE_FUNCTION = re.compile(r"\b(deriv|delta|idelta|predict_linear)\s*\(\s*([A-Za-z_][A-Za-z0-9_:]*)")
UNDER_CI = os.environ.get("CI") == "true"


def promtool() -> str:
    """promtool's path; skip without it, except under CI (``.ci/run`` installs it), where it fails."""
    path = shutil.which("promtool")
    if path is None:
        if UNDER_CI:
            pytest.fail("promtool is missing under CI (.ci/run installs Debian's prometheus package)")
        pytest.skip("promtool is not installed (Debian's prometheus package)")
    return path


def exported_types(text: str) -> Dict[str, str]:
    """Metric name -> type (``gauge``, ``counter``, ...) of a /metrics scrape; a counter under its
    sample name too (``..._total``), as PromQL names it. Families without samples count: the
    collector declares them whether or not the fleet has such a figure now."""
    from prometheus_client.parser import text_string_to_metric_families
    types: Dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        if family.type == "counter":
            types[family.name + "_total"] = "counter"
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                types.setdefault(sample.name, family.type)
    return types


def names_in(texts: Iterable[str]) -> Set[str]:
    """The streamfl metric names in ``texts``."""
    return {name for text in texts for name in STREAMFL_NAME.findall(text)}


def selectors(expr: str) -> Set[str]:
    """The metric names of ``expr``'s selectors that carry label matchers (``name{...}``), any
    prefix: with ``names_in`` it tells a made-up series (``ALERTS``, ``up``) from streamfl's own."""
    return set(re.findall(r"(?<![\w\"$.{=~])\b([A-Za-z_][A-Za-z0-9_:]*)\s*\{", expr))


def misuses(expr: str, types: Dict[str, str]) -> List[Tuple[str, str, str]]:
    """``(function, metric, its type)`` for each counter function applied to a metric that is not a
    counter and each gauge slope applied to a counter, in ``expr``."""
    out = []
    for function, metric in COUNTER_FUNCTION.findall(expr):
        if metric in types and types[metric] != "counter":
            out.append((function, metric, types[metric]))
    for function, metric in GAUGE_FUNCTION.findall(expr):
        if types.get(metric) == "counter":
            out.append((function, metric, "counter"))
    return out
