"""Turn locust's CSV output into a summary table, a plot and a verdict against the run's limits.

Reads ``<prefix>_stats.csv`` (totals per endpoint and the ``Aggregated`` row) and
``<prefix>_stats_history.csv`` (one row per second: throughput and the current p50/p95/p99, locust's
rolling 10-second window). The verdict uses the totals of the whole run: failure ratio = failures /
requests, and locust's p99 over all requests.

A paragraph request (``<endpoint> (paragraph)``, loadtest/texts.py) is its own row of locust's stats, so the table
shows its latency apart from the endpoint's single sentences, with the mean sentences per request from
``<prefix>_sentences.json`` (written by the locustfile), a line comparing the p50s, and a panel of the plot.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from loadtest.texts import split_name

AGGREGATED = "Aggregated"
SENTENCES_SUFFIX = "_sentences.json"


@dataclass
class Row:
    """One line of ``_stats.csv``: an endpoint over one protocol, or the aggregate."""

    type: str
    name: str
    requests: int
    failures: int
    rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    sentences: float = math.nan  # mean sentences a request sent (1 for a single text), when the locustfile wrote it

    @property
    def failure_ratio(self) -> float:
        return self.failures / self.requests if self.requests else 0.0

    @property
    def endpoint(self) -> str:
        return split_name(self.name)[0]

    @property
    def paragraph(self) -> bool:
        return split_name(self.name)[1]


@dataclass
class Verdict:
    passed: bool
    reasons: list[str]


def _number(value: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan  # locust writes "N/A" before it has a sample


def read_stats(path: Path) -> list[Row]:
    with open(path, newline="") as f:
        return [
            Row(
                type=rec["Type"],
                name=rec["Name"],
                requests=int(rec["Request Count"]),
                failures=int(rec["Failure Count"]),
                rps=_number(rec["Requests/s"]),
                p50_ms=_number(rec["50%"]),
                p95_ms=_number(rec["95%"]),
                p99_ms=_number(rec["99%"]),
                max_ms=_number(rec["Max Response Time"]),
            )
            for rec in csv.DictReader(f)
        ]


def read_sentences(path: Path) -> dict[tuple[str, str], tuple[int, int]]:
    """(type, name) → (requests sent, sentences sent), or {} when the file is missing."""
    if not path.exists():
        return {}
    return {(r["type"], r["name"]): (r["requests"], r["sentences"]) for r in json.loads(path.read_text())}


def add_sentences(rows: list[Row], sent: dict[tuple[str, str], tuple[int, int]]) -> None:
    """Fill each row's mean sentences per request; the Aggregated row's over every request."""
    for row in rows:
        if row.name == AGGREGATED:
            requests, sentences = sum(r for r, _ in sent.values()), sum(s for _, s in sent.values())
        else:
            requests, sentences = sent.get((row.type, row.name), (0, 0))
        row.sentences = sentences / requests if requests else math.nan


def compare(rows: list[Row]) -> list[str]:
    """One line per (type, endpoint) with both kinds: the paragraphs' p50 and p95 against the single texts'."""
    single = {(r.type, r.endpoint): r for r in rows if not r.paragraph and r.name != AGGREGATED}
    lines = []
    for row in rows:
        base = single.get((row.type, row.endpoint))
        if row.paragraph and base is not None:
            ratio = row.p50_ms / base.p50_ms if base.p50_ms > 0 else math.nan
            lines.append(
                f"paragraphs: {row.type} {row.endpoint} p50 {row.p50_ms:.0f} ms vs {base.p50_ms:.0f} ms single "
                f"({ratio:.1f}x), p95 {row.p95_ms:.0f} vs {base.p95_ms:.0f} ms"
            )
    return lines


def aggregate(rows: list[Row]) -> Row:
    for row in rows:
        if row.name == AGGREGATED:
            return row
    raise ValueError("locust stats have no Aggregated row")


def read_history(path: Path) -> dict[str, list[float]]:
    """Aggregated time series: seconds since start, users, requests/s, failures/s, p50, p95, p99 (ms).

    Throughput is the change of the running totals between two rows (locust's own ``Requests/s`` column is
    a 10-second average that lags); the percentiles are locust's rolling 10-second window.
    """
    series: dict[str, list[float]] = {k: [] for k in ("t", "users", "rps", "fps", "p50", "p95", "p99")}
    with open(path, newline="") as f:
        records = [rec for rec in csv.DictReader(f) if rec["Name"] == AGGREGATED]
    if not records:
        return series
    t0 = int(records[0]["Timestamp"])
    last_t, last_requests, last_failures = t0, 0, 0
    for rec in records:
        t = int(rec["Timestamp"])
        requests, failures = int(rec["Total Request Count"]), int(rec["Total Failure Count"])
        dt = max(t - last_t, 1)
        series["t"].append(t - t0)
        series["users"].append(_number(rec["User Count"]))
        series["rps"].append((requests - last_requests) / dt)
        series["fps"].append((failures - last_failures) / dt)
        for q in ("50", "95", "99"):
            value = _number(rec[f"{q}%"])
            series[f"p{q}"].append(value if value > 0 else math.nan)  # 0: no sample in the window yet
        last_t, last_requests, last_failures = t, requests, failures
    return series


def read_named_p50(path: Path) -> dict[tuple[str, str], tuple[list[float], list[float]]]:
    """(type, name) → (seconds since start, p50 ms of locust's 10 s window) from the full history, for every request
    name of a run that sent paragraphs; {} when it sent none."""
    with open(path, newline="") as f:
        records = list(csv.DictReader(f))
    if not records or not any(split_name(rec["Name"])[1] for rec in records):
        return {}
    t0 = int(records[0]["Timestamp"])
    series: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for rec in records:
        if rec["Name"] == AGGREGATED:
            continue
        value = _number(rec["50%"])
        t, p50 = series.setdefault((rec["Type"], rec["Name"]), ([], []))
        t.append(int(rec["Timestamp"]) - t0)
        p50.append(value if value > 0 else math.nan)
    return series


def plot(
    history: dict[str, list[float]],
    path: Path,
    title: str,
    named: dict[tuple[str, str], tuple[list[float], list[float]]] | None = None,
) -> Path:
    """Throughput (top) and p50/p95/p99 latency (middle) over time, as a PNG; with `named` (a run that sent
    paragraphs), a bottom panel of each request name's p50, paragraphs dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    if named:
        fig, (top, bottom, names) = plt.subplots(3, 1, figsize=(12, 9.5), sharex=True)
    else:
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    top.plot(history["t"], history["rps"], label="requests/s (per 1 s)", color="tab:blue")
    top.plot(history["t"], history["fps"], label="failures/s", color="tab:red")
    top.set_ylabel("per second")
    top.legend(loc="upper left")
    top.grid(alpha=0.3)
    users = top.twinx()
    users.plot(history["t"], history["users"], label="users", color="tab:gray", linestyle=":")
    users.set_ylabel("users")
    for q, color in (("p50", "tab:green"), ("p95", "tab:orange"), ("p99", "tab:red")):
        bottom.plot(history["t"], history[q], label=q, color=color)
    bottom.set_ylabel("latency, ms (10 s window)")
    bottom.legend(loc="upper left")
    bottom.grid(alpha=0.3)
    if named:
        colors = {}
        for (kind, name), (t, p50) in named.items():
            endpoint, paragraph = split_name(name)
            color = colors.setdefault((kind, endpoint), f"C{len(colors) % 10}")
            names.plot(t, p50, label=f"{kind} {name}", color=color, linestyle="--" if paragraph else "-")
        names.set_ylabel("p50 ms by request (10 s window)")
        names.set_yscale("log")
        names.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        names.yaxis.set_major_formatter(ScalarFormatter())
        names.yaxis.set_minor_formatter(NullFormatter())
        names.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
        names.grid(alpha=0.3)
    (names if named else bottom).set_xlabel("seconds since start")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def judge(total: Row, max_failure_ratio: float, max_p99_ms: float) -> Verdict:
    reasons = []
    if total.requests == 0:
        reasons.append("no request completed")
    if total.failure_ratio > max_failure_ratio:
        reasons.append(f"failure ratio {total.failure_ratio:.4f} > limit {max_failure_ratio}")
    if not math.isnan(total.p99_ms) and total.p99_ms > max_p99_ms:
        reasons.append(f"p99 {total.p99_ms:.0f} ms > limit {max_p99_ms:.0f} ms")
    return Verdict(passed=not reasons, reasons=reasons)


def table(rows: list[Row]) -> str:
    """One line per row of locust's stats: a paragraph request name is its own line; `sent.` is the mean sentences
    per request (shown when any row has it)."""
    width = max([11, *(len(r.name) for r in rows)])
    sentences = any(not math.isnan(r.sentences) for r in rows)
    head = f"{'type':<6} {'endpoint':<{width}} {'requests':>8} {'fail':>6} {'fail %':>7} {'req/s':>8} "
    head += f"{'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8}" + (f" {'sent.':>5}" if sentences else "")
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (
            f"{r.type or '':<6} {r.name:<{width}} {r.requests:>8} {r.failures:>6} {100 * r.failure_ratio:>6.2f}% "
            f"{r.rps:>8.2f} {r.p50_ms:>8.0f} {r.p95_ms:>8.0f} {r.p99_ms:>8.0f} {r.max_ms:>8.0f}"
        )
        if sentences:
            line += f" {r.sentences:>5.1f}" if not math.isnan(r.sentences) else " " * 6
        lines.append(line)
    return "\n".join(lines)


def write_report(
    out_dir: Path, prefix: str, max_failure_ratio: float, max_p99_ms: float, settings: dict
) -> tuple[str, Verdict]:
    """Summary text (also written to summary.txt), summary.json and plot.png; returns (text, verdict)."""
    rows = read_stats(out_dir / f"{prefix}_stats.csv")
    add_sentences(rows, read_sentences(out_dir / f"{prefix}{SENTENCES_SUFFIX}"))
    total = aggregate(rows)
    verdict = judge(total, max_failure_ratio, max_p99_ms)
    history_path = out_dir / f"{prefix}_stats_history.csv"
    history = read_history(history_path)
    title = (
        f"ropeserve load test {datetime.now():%Y-%m-%d %H:%M} — {settings.get('users')} users, {settings.get('mix')}"
        f", paragraphs {settings.get('paragraphs', 0)}"
    )
    plot(history, out_dir / "plot.png", title, read_named_p50(history_path))
    status = "PASS" if verdict.passed else "FAIL: " + "; ".join(verdict.reasons)
    limits = f"limits: failure ratio <= {max_failure_ratio}, p99 <= {max_p99_ms:.0f} ms"
    text = "\n".join([table(rows), *compare(rows), limits, status]) + "\n"
    (out_dir / "summary.txt").write_text(text)
    summary = {
        "settings": settings,
        "limits": {"max_failure_ratio": max_failure_ratio, "max_p99_ms": max_p99_ms},
        "passed": verdict.passed,
        "reasons": verdict.reasons,
        "rows": [
            asdict(r)
            | {
                "sentences": None if math.isnan(r.sentences) else r.sentences,
                "endpoint": r.endpoint,
                "paragraph": r.paragraph,
                "failure_ratio": r.failure_ratio,
            }
            for r in rows
        ],
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=True) + "\n")
    return text, verdict
