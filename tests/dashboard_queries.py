"""Read the Grafana dashboards' PromQL and the metric names in it, to check them against a live server.

``python tests/dashboard_queries.py`` lists every query and the metric names it uses. The tests compare those names
with what a running Triton really exports, and run the queries on a real Prometheus.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DASHBOARD_DIR = Path(__file__).resolve().parents[1] / "serving" / "grafana" / "dashboards"

# Triton exports these only when it sees a GPU (the NGC image on a GPU host); the embedded CPU server has none.
GPU_ONLY_METRICS = frozenset({"nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"})

_KEYWORDS = {"bool", "and", "or", "unless", "group_left", "group_right", "inf", "nan", "Inf", "NaN"}
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@dataclass(frozen=True)
class Query:
    dashboard: str
    panel: str
    expr: str


def dashboard_queries(folder: Path = DASHBOARD_DIR) -> list[Query]:
    """Every target expression of every panel (rows' nested panels included) of every dashboard JSON."""
    queries = []
    for path in sorted(folder.glob("*.json")):
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        for panel in _panels(dashboard.get("panels", [])):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    queries.append(Query(path.name, panel.get("title", "?"), target["expr"]))
    return queries


def _panels(panels: list[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads: identifiers that are not functions, keywords, labels or ranges, and
    the alternatives of a ``{__name__=~"a|b"}`` selector."""
    names = {name for names in re.findall(r'__name__=~?"([^"]*)"', expr) for name in names.split("|")}
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals (label values)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors, $__rate_interval
    expr = _GROUPING.sub("", expr)  # by (model, le) ...
    expr = re.sub(r"(?:\boffset|@)\s*-?[0-9a-zA-Z.]+", "", expr)  # offset 5m, @ 1609746000
    for match in _IDENTIFIER.finditer(expr):
        if expr[match.end() :].lstrip().startswith("(") or match.group() in _KEYWORDS:
            continue  # a function or aggregation call, or an operator keyword
        names.add(match.group())
    return names


def exported_metric_names(exposition: str) -> set[str]:
    """Names a Prometheus scrape of ``exposition`` would store (samples, and histogram/summary series)."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            names.add(name)
            if kind in ("histogram", "summary"):
                names |= {name + "_sum", name + "_count"} | ({name + "_bucket"} if kind == "histogram" else set())
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def main() -> int:
    for query in dashboard_queries():
        print(f"{query.panel}: {', '.join(sorted(metric_names(query.expr)))}\n    {query.expr}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
