"""Turn locust's CSV output into a summary table, a plot and a verdict against the run's limits.

Reads ``<prefix>_stats.csv`` (totals per endpoint and the ``Aggregated`` row) and
``<prefix>_stats_history.csv`` (one row per second: throughput and the current p50/p95/p99, locust's
rolling 10-second window). The verdict uses the totals of the whole run: failure ratio = failures /
requests, and locust's p99 over all requests.

A paragraph request (``<endpoint> (paragraph)``, loadtest/texts.py) is its own row of locust's stats, so the table
shows its latency apart from the endpoint's single sentences, with the mean sentences per request from
``<prefix>_sentences.json`` (written by the locustfile), a line comparing the p50s, and a panel of the plot.

A streaming twin (``translate_stream``, ``summarize_stream``) is its own row too, its latency the whole answer's; the
table lists the twins after the unary endpoints, and a second table gives, per protocol and name, the streamed
answers' time to the first non-empty piece (``first``), mean time between pieces (``gap``) and whole time, p50 and
p99 over the successful answers, from ``<prefix>_streams.json`` (written by the locustfile); the plot gets a panel of
the first piece's and the whole answer's p50 per 10 s window.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from loadtest.texts import is_stream, split_name

AGGREGATED = "Aggregated"
SENTENCES_SUFFIX = "_sentences.json"
STREAMS_SUFFIX = "_streams.json"
WINDOW_S = 10  # the plot's streaming panel: p50 per window, as locust's own rolling window
STREAM_FIELDS = ("first_p50_ms", "first_p99_ms", "gap_p50_ms", "gap_p99_ms", "whole_p50_ms", "whole_p99_ms", "pieces")


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
    # a streaming twin's successful answers (from the locustfile's streams file): their count, the time to the first
    # non-empty piece, the mean time between pieces within an answer, the whole answer's time, the mean pieces
    streams: int = 0
    first_p50_ms: float = math.nan
    first_p99_ms: float = math.nan
    gap_p50_ms: float = math.nan
    gap_p99_ms: float = math.nan
    whole_p50_ms: float = math.nan
    whole_p99_ms: float = math.nan
    pieces: float = math.nan

    @property
    def failure_ratio(self) -> float:
        return self.failures / self.requests if self.requests else 0.0

    @property
    def endpoint(self) -> str:
        return split_name(self.name)[0]

    @property
    def paragraph(self) -> bool:
        return split_name(self.name)[1]

    @property
    def stream(self) -> bool:
        """A streaming twin's row (``<task>_stream``, or its paragraphs)."""
        return is_stream(self.endpoint)


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


Sample = list  # [end (unix s), first piece ms, mean ms between pieces or None, whole ms, pieces]


def read_streams(path: Path) -> dict[tuple[str, str], list[Sample]]:
    """(type, name) → the streamed answers' samples, or {} when the file is missing (no stream was sent)."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    fields = data["fields"]
    assert fields[:5] == ["end", "first_ms", "gap_ms", "whole_ms", "pieces"], fields
    return {(r["type"], r["name"]): r["samples"] for r in data["rows"]}


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (q in [0, 100]) of `values`; NaN for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]


def add_streams(rows: list[Row], streamed: dict[tuple[str, str], list[Sample]]) -> None:
    """Fill each streaming row's first-piece, between-pieces and whole-answer percentiles from its samples."""
    for row in rows:
        samples = streamed.get((row.type, row.name), [])
        if not samples:
            continue
        first = [s[1] for s in samples]
        gaps = [s[2] for s in samples if s[2] is not None]  # an answer of one piece has no gap
        whole = [s[3] for s in samples]
        row.streams = len(samples)
        row.first_p50_ms, row.first_p99_ms = percentile(first, 50), percentile(first, 99)
        row.gap_p50_ms, row.gap_p99_ms = percentile(gaps, 50), percentile(gaps, 99)
        row.whole_p50_ms, row.whole_p99_ms = percentile(whole, 50), percentile(whole, 99)
        row.pieces = sum(s[4] for s in samples) / len(samples)


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


def history_start(path: Path) -> float | None:
    """The unix time of the history's first row (its "seconds since start" 0), None for an empty history."""
    with open(path, newline="") as f:
        first = next(csv.DictReader(f), None)
    return None if first is None else float(first["Timestamp"])


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


def stream_windows(
    streamed: dict[tuple[str, str], list[Sample]], t0: float, window_s: int = WINDOW_S
) -> dict[tuple[str, str], dict[str, list[float]]]:
    """(type, name) → {"t": window's middle (s since `t0`), "first": p50 ms, "whole": p50 ms} per window of
    `window_s` seconds that ended some of its answers."""
    series = {}
    for key, samples in streamed.items():
        windows: dict[int, list[Sample]] = {}
        for sample in samples:
            windows.setdefault(int((sample[0] - t0) // window_s), []).append(sample)
        ordered = sorted(windows.items())
        series[key] = {
            "t": [(k + 0.5) * window_s for k, _ in ordered],
            "first": [percentile([s[1] for s in w], 50) for _, w in ordered],
            "whole": [percentile([s[3] for s in w], 50) for _, w in ordered],
        }
    return series


def _log_axis(axis) -> None:  # noqa: ANN001 - a matplotlib Axes
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    axis.set_yscale("log")
    axis.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    axis.yaxis.set_major_formatter(ScalarFormatter())
    axis.yaxis.set_minor_formatter(NullFormatter())
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    axis.grid(alpha=0.3)


def plot(
    history: dict[str, list[float]],
    path: Path,
    title: str,
    named: dict[tuple[str, str], tuple[list[float], list[float]]] | None = None,
    streams: dict[tuple[str, str], dict[str, list[float]]] | None = None,
) -> Path:
    """Throughput (top) and p50/p95/p99 latency (second) over time, as a PNG; with `named` (a run that sent
    paragraphs), a panel of each request name's p50, paragraphs dashed; with `streams` (a run that sent streaming
    twins, :func:`stream_windows`), a panel of each twin's first-piece p50 (solid) and whole-answer p50 (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 + bool(named) + bool(streams)
    fig, axes = plt.subplots(panels, 1, figsize=(10 if panels == 2 else 12, 3.25 * panels), sharex=True)
    top, bottom = axes[0], axes[1]
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
        names = axes[2]
        colors = {}
        for (kind, name), (t, p50) in named.items():
            endpoint, paragraph = split_name(name)
            color = colors.setdefault((kind, endpoint), f"C{len(colors) % 10}")
            names.plot(t, p50, label=f"{kind} {name}", color=color, linestyle="--" if paragraph else "-")
        names.set_ylabel("p50 ms by request (10 s window)")
        _log_axis(names)
    if streams:
        panel = axes[-1]
        for n, ((kind, name), series) in enumerate(sorted(streams.items())):
            color = f"C{n % 10}"
            panel.plot(series["t"], series["first"], label=f"{kind} {name} first piece", color=color, marker=".")
            panel.plot(series["t"], series["whole"], label=f"{kind} {name} whole", color=color, linestyle="--")
        panel.set_ylabel(f"streams: p50 ms ({WINDOW_S} s windows)")
        _log_axis(panel)
    axes[-1].set_xlabel("seconds since start")
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


def ordered(rows: list[Row]) -> list[Row]:
    """locust's rows with the streaming twins apart: the unary endpoints, then the twins, then Aggregated."""
    return sorted(rows, key=lambda r: 2 if r.name == AGGREGATED else int(r.stream))


def table(rows: list[Row]) -> str:
    """One line per row of locust's stats: a paragraph request name is its own line; `sent.` is the mean sentences
    per request (shown when any row has it). The streaming twins (their whole answers) follow the unary endpoints."""
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


def stream_table(rows: list[Row]) -> str:
    """The streaming twins' successful answers: time to the first piece, between pieces and whole, p50/p99 (ms); ""
    for a run without streams ("-": no answer succeeded, or, for the gap, every answer came in one piece)."""
    streamed = [r for r in rows if r.stream and r.name != AGGREGATED]
    if not streamed:
        return ""
    width = max([16, *(len(r.name) for r in streamed)])
    head = f"{'type':<6} {'stream':<{width}} {'answers':>8} "
    head += " ".join(f"{c:>9}" for c in ("first p50", "first p99", "gap p50", "gap p99", "whole p50", "whole p99"))
    head += f" {'pieces':>6}"
    lines = ["streams (ms): first = to the first non-empty piece, gap = mean between pieces, whole = the answer", head]
    lines.append("-" * len(head))
    for r in streamed:
        values = (r.first_p50_ms, r.first_p99_ms, r.gap_p50_ms, r.gap_p99_ms, r.whole_p50_ms, r.whole_p99_ms)
        cells = " ".join(f"{'-':>9}" if math.isnan(v) else f"{v:>9.0f}" for v in values)  # -: no gap, one piece
        line = f"{r.type or '':<6} {r.name:<{width}} {r.streams:>8} {cells}"
        lines.append(line + (f" {'-':>6}" if math.isnan(r.pieces) else f" {r.pieces:>6.1f}"))
    return "\n".join(lines)


def write_report(
    out_dir: Path, prefix: str, max_failure_ratio: float, max_p99_ms: float, settings: dict
) -> tuple[str, Verdict]:
    """Summary text (also written to summary.txt), summary.json and plot.png; returns (text, verdict)."""
    rows = ordered(read_stats(out_dir / f"{prefix}_stats.csv"))
    add_sentences(rows, read_sentences(out_dir / f"{prefix}{SENTENCES_SUFFIX}"))
    streamed = read_streams(out_dir / f"{prefix}{STREAMS_SUFFIX}")
    add_streams(rows, streamed)
    total = aggregate(rows)
    verdict = judge(total, max_failure_ratio, max_p99_ms)
    history_path = out_dir / f"{prefix}_stats_history.csv"
    history = read_history(history_path)
    title = (
        f"ropeserve load test {datetime.now():%Y-%m-%d %H:%M} — {settings.get('users')} users, {settings.get('mix')}"
        f", paragraphs {settings.get('paragraphs', 0)}"
    )
    t0 = history_start(history_path)  # the streams' windows on the history's time axis
    if t0 is None:
        t0 = min((sample[0] for samples in streamed.values() for sample in samples), default=0)
    plot(history, out_dir / "plot.png", title, read_named_p50(history_path), stream_windows(streamed, t0))
    status = "PASS" if verdict.passed else "FAIL: " + "; ".join(verdict.reasons)
    limits = f"limits: failure ratio <= {max_failure_ratio}, p99 <= {max_p99_ms:.0f} ms"
    text = "\n".join(filter(None, [table(rows), *compare(rows), stream_table(rows), limits, status])) + "\n"
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
                "stream": r.stream,
                "failure_ratio": r.failure_ratio,
            }
            | {k: None if math.isnan(getattr(r, k)) else getattr(r, k) for k in STREAM_FIELDS}
            for r in rows
        ],
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=True) + "\n")
    return text, verdict
