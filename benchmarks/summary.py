"""BENCHMARKS.md's opening table: every bar of every committed result file, its value, met or not, and the run.

The bars come from the result files themselves: the ``checks`` a ``python -m benchmarks`` run evaluated, and for
the runs of the single-purpose benchmarks (streams, soak, queue policy) the bars their issue set, computed here
from their figures.

    python -m benchmarks.summary           # rewrites the table between the markers in BENCHMARKS.md
    python -m benchmarks.summary --check   # exit 1 when the committed table is not what the results give
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.markdown import between_markers, write_or_check

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCUMENT = ROOT / "BENCHMARKS.md"
BEGIN = "<!-- summary: written by `python -m benchmarks.summary` from benchmarks/results/*.json -->"
END = "<!-- summary end -->"


def bar(name: str, value: float, limit: float, higher_is_better: bool = True) -> dict[str, Any]:
    met = value >= limit if higher_is_better else value <= limit
    return {"name": name, "value": value, "bar": limit, "higher_is_better": higher_is_better, "met": met}


def stream_bars(data: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for run in data["runs"]:
        if run["cancelled"]:
            continue  # what a cancelling third-party client does: documented, not a bar of ours
        label = f"SDK streams over {run['protocol']}" + (", a fifth abandoned" if run["abandoned_share"] else "")
        out.append(bar(f"{label}: tritonserver bytes a stream", run["bytes_per_stream"], 100, higher_is_better=False))
        out.append(bar(f"{label}: stream rate, last minute ÷ first", run["rate_ratio"], 0.8))
    return out


def soak_bars(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        bar("soak: failures", data["failures"], 0, higher_is_better=False),
        bar("soak: tritonserver growth over the second half (MB)", data["server_rss_second_half_mb"], 5,
            higher_is_better=False),
        bar("soak: throughput, last 10 min ÷ minutes 2–12", data["throughput_ratio"], 0.9),
        bar("soak: p50, last 10 min ÷ minutes 2–12", data["p50_ratio"], 1.15, higher_is_better=False),
    ]  # fmt: skip


def queue_policy_bars(data: dict[str, Any]) -> list[dict[str, Any]]:
    """p99 at 32 clients with the committed queue bound ÷ without one, per front instance count."""
    p99 = {(r["variant"], r["instances"]): r["p99_ms"] for r in data["rows"] if r["concurrency"] == 32}
    counts = sorted(count for variant, count in p99 if variant == "committed" and ("none", count) in p99)
    return [
        bar(f"sentiment p99 at c=32, committed queue bound ÷ none (perf_analyzer, {count} instance(s))",
            p99[("committed", count)] / p99[("none", count)], 1.5, higher_is_better=False)
        for count in counts
    ]  # fmt: skip


def bars_of(path: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    """The bars of one result file (its parsed JSON ``data``)."""
    if "checks" in data:
        return data["checks"]
    if path.stem == "streams":
        return stream_bars(data)
    if path.stem == "queue_policy":
        return queue_policy_bars(data)
    if path.stem.startswith("soak_") and "server_rss_second_half_mb" in data:  # the hour-long soak's format
        return soak_bars(data)
    return []


def run_label(path: Path, data: dict[str, Any]) -> str:
    started = data.get("meta", {}).get("started", "")[:10]
    return f"[{path.name}](benchmarks/results/{path.name})" + (f" {started}" if started else "")


def table(results: Path = RESULTS) -> str:
    lines = ["| comparison | value | bar | met | run |", "|---|---|---|---|---|"]
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        label = run_label(path, data)
        for b in bars_of(path, data):
            sign = "≥" if b["higher_is_better"] else "≤"
            lines.append(
                f"| {b['name']} | {b['value']:.3g} | {sign} {b['bar']:g} | {'yes' if b['met'] else '**no**'} | "
                f"{label} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.summary", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when BENCHMARKS.md differs")
    args = parser.parse_args(argv)
    wanted = between_markers(DOCUMENT.read_text(encoding="utf-8"), BEGIN, END, table())
    return write_or_check(DOCUMENT, wanted, args.check, "python -m benchmarks.summary")


if __name__ == "__main__":
    raise SystemExit(main())
