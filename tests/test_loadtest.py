"""`make loadtest`: real locust (gRPC + HTTP users) against the embedded server, its files, summary and verdict."""

from __future__ import annotations

import csv
import json
import re
import subprocess
from functools import partial
from pathlib import Path

import pytest

from loadtest.report import Row, compare, judge, table, write_report
from loadtest.run import build_parser, locust_command
from loadtest.texts import (
    DEFAULT_PARAGRAPHS,
    Picker,
    endpoints,
    inputs_for,
    join_sentences,
    load_texts,
    paragraph_endpoints,
    parse_mix,
    parse_paragraphs,
)
from serving.metrics import metric_sum, settled

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT.parent / "shared" / "data"


def make_loadtest(triton, results: Path, timeout_s: float, **variables: str) -> subprocess.CompletedProcess:
    settings = {
        "HOST": triton.http_url,
        "GRPC_HOST": triton.grpc_url,
        "USERS": "4",
        "MAX_NEW_TOKENS": "8",
        "NUM_BEAMS": "1",
        "RESULTS": str(results),
        "DATA_DIR": str(DATA_DIR),
        **variables,
    }
    command = ["make", "--no-print-directory", "loadtest", *(f"{k}={v}" for k, v in settings.items())]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False)


def test_make_loadtest_writes_csv_html_plot_and_summary(triton, tmp_path):
    truncated = partial(metric_sum, triton.metrics_url, "ropeserve_truncated_texts_total", model="translate")
    sentences = partial(metric_sum, triton.metrics_url, "ropeserve_sentences_per_text_sum", model="translate")
    before = settled(lambda: (truncated(), sentences()), lambda now: True)
    # PARAGRAPHS=0.5: enough paragraph requests in 10 s that each paragraph task sends some
    run = make_loadtest(
        triton, tmp_path, 120, DURATION="10s", MAX_FAILURE_RATIO="0", MAX_P99_MS="60000", PARAGRAPHS="0.5"
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (out,) = list(tmp_path.iterdir())
    for name in ("locust_stats.csv", "locust_stats_history.csv", "locust_failures.csv", "report.html", "summary.txt"):
        assert (out / name).stat().st_size > 0, name
    png = (out / "plot.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert "<html" in (out / "report.html").read_text(errors="replace").lower()

    with open(out / "locust_stats.csv", newline="") as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    # both protocols, every endpoint of the mix, no failure
    assert {("grpc", "sentiment"), ("POST", "sentiment"), ("grpc", "translate"), ("POST", "translate")} <= set(rows)
    total = rows[("", "Aggregated")]
    assert int(total["Request Count"]) >= 20 and int(total["Failure Count"]) == 0
    # paragraphs go under their own name, apart from the endpoint's single sentences; summarize sends none
    names = {name for _, name in rows}
    assert {"translate (paragraph)", "sentiment (paragraph)"} <= names and "summarize (paragraph)" not in names
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"] is True and summary["settings"]["users"] == 4 and summary["settings"]["paragraphs"] == 0.5
    paragraph_rows = [r for r in summary["rows"] if r["paragraph"]]
    assert paragraph_rows and {r["endpoint"] for r in paragraph_rows} == {"translate", "sentiment"}
    assert all(4 <= r["sentences"] <= 8 and r["failures"] == 0 for r in paragraph_rows), paragraph_rows
    assert all(r["sentences"] == 1 for r in summary["rows"] if not r["paragraph"] and r["name"] != "Aggregated")
    # the table is printed, with the verdict, paragraph rows apart
    assert "Aggregated" in run.stdout and "p99 ms" in run.stdout and "PASS" in run.stdout
    assert re.search(r"^(grpc|POST) +translate \(paragraph\) +\d+", run.stdout, re.M), run.stdout
    assert "paragraphs: " in run.stdout and " ms single " in run.stdout
    log = (out / "locust.log").read_text()
    assert "Traceback" not in log, log[-2000:]
    # translate read the paragraphs as sentences and cut none of them at the model's window
    after = settled(lambda: (truncated(), sentences()), lambda now: now[1] > before[1])
    assert after[0] == before[0] and after[1] > before[1]
    if DATA_DIR.is_dir():
        assert "sentiment texts from " + str(DATA_DIR) in log


def test_make_loadtest_fails_when_p99_is_over_the_limit(triton, tmp_path):
    run = make_loadtest(triton, tmp_path, 90, DURATION="4s", USERS="2", MAX_P99_MS="1", MIX="sentiment:1")
    assert run.returncode != 0
    assert "FAIL: p99" in run.stdout and "> limit 1 ms" in run.stdout, run.stdout[-2000:]
    (out,) = list(tmp_path.iterdir())
    assert json.loads((out / "summary.json").read_text())["passed"] is False


def test_mix_texts_and_verdict():
    assert parse_mix("sentiment:6,translate:3") == {"sentiment": 6.0, "translate": 3.0, "summarize": 0.0}
    for bad in ("sentiment:x", "sentimint:1", "sentiment:0", "translate:-1"):
        with pytest.raises(ValueError):
            parse_mix(bad)
    texts, sources = load_texts(None)
    assert texts == {name: list(spec.texts) for name, spec in endpoints().items()}
    assert set(sources.values()) == {"built-in list"}
    # options go only to the tasks that take them, and 0 leaves the server's default
    assert inputs_for("translate", {"num_beams": 2, "max_new_tokens": 0}) == {"NUM_BEAMS": 2}
    assert inputs_for("sentiment", {"num_beams": 2}) == {}
    if DATA_DIR.is_dir():
        texts, sources = load_texts(DATA_DIR, limit=50)
        assert all(len(v) == 50 for v in texts.values()) and "built-in list" not in sources.values()
        assert all(t.strip() and "\t" not in t for v in texts.values() for t in v)

    def row(requests: int, failures: int, p99: float) -> Row:
        return Row("", "Aggregated", requests, failures, 1.0, 1.0, 1.0, p99, p99)

    assert judge(row(100, 1, 50), 0.01, 100).passed
    assert judge(row(100, 2, 50), 0.01, 100).reasons == ["failure ratio 0.0200 > limit 0.01"]
    assert judge(row(100, 0, 150), 0.01, 100).reasons == ["p99 150 ms > limit 100 ms"]
    assert judge(row(0, 0, float("nan")), 0.01, 100).reasons == ["no request completed"]


def test_paragraphs_join_4_to_8_consecutive_sentences_at_the_chosen_share():
    assert sorted(paragraph_endpoints()) == ["sentiment", "translate"]  # summarize's texts are articles already
    for data_dir in (None, DATA_DIR if DATA_DIR.is_dir() else None):
        texts, _ = load_texts(data_dir, limit=300)
        weights = parse_mix("sentiment:6,translate:3,summarize:1")
        picker = Picker(texts, weights, 0.2, seed=7)
        picks = [picker.pick() for _ in range(6000)]
        again = Picker(texts, weights, 0.2, seed=7)
        assert [again.pick() for _ in range(6000)] == picks  # deterministic with a seed
        for endpoint in ("translate", "sentiment"):
            mine = [p for p in picks if p.endpoint == endpoint]
            paragraphs = [p for p in mine if p.name == f"{endpoint} (paragraph)"]
            assert 0.16 < len(paragraphs) / len(mine) < 0.24, (endpoint, len(paragraphs), len(mine))
            assert {p.sentences for p in paragraphs} == {4, 5, 6, 7, 8}
            for p in paragraphs:  # consecutive sentences of the text set, joined with no space
                ring = texts[endpoint] * 3  # a short built-in list (6 texts) wraps around
                joined = [join_sentences(ring[i : i + p.sentences]) for i in range(len(texts[endpoint]))]
                assert p.text in joined
            assert all(p.sentences == 1 and p.text in texts[endpoint] for p in mine if p.name == endpoint)
        summarize = [p for p in picks if p.endpoint == "summarize"]
        assert summarize and all(p.name == "summarize" and p.sentences == 1 for p in summarize)
    # 0: today's behaviour, single texts under the endpoint's name only
    texts, _ = load_texts(None)
    picker = Picker(texts, parse_mix("translate:1,sentiment:1"), 0, seed=1)
    picks = [picker.pick() for _ in range(2000)]
    assert all(p.name == p.endpoint and p.sentences == 1 and p.text in texts[p.endpoint] for p in picks)
    assert all(Picker(texts, parse_mix("translate:1"), 1, seed=s).pick().sentences >= 4 for s in range(50))
    # Chinese sentences are joined as written; one without end punctuation gets a full stop
    assert join_sentences(["我爱你。", "你呢？", "很好吃", "他说：“好。”"]) == "我爱你。你呢？很好吃。他说：“好。”"
    assert parse_paragraphs("0") == 0 and parse_paragraphs(1) == 1
    for bad in ("-0.1", "1.5", "x"):
        with pytest.raises(ValueError):
            parse_paragraphs(bad)
    # the runner's flag (default one in five) reaches locust
    args = build_parser().parse_args([])
    assert args.paragraphs == DEFAULT_PARAGRAPHS == 0.2
    args = build_parser().parse_args(["--paragraphs", "0"])
    command = locust_command(args, Path("/tmp/x"))
    assert float(command[command.index("--paragraphs") + 1]) == 0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--paragraphs", "2"])
    make = subprocess.run(["make", "-n", "loadtest", "PARAGRAPHS=0.35"], cwd=ROOT, capture_output=True, text=True)
    assert "--paragraphs 0.35" in make.stdout, make.stdout + make.stderr


def test_report_keeps_paragraph_rows_apart(tmp_path):
    """locust's CSV files of a run with paragraphs → a table row, a comparison line, summary rows and a plot."""
    stats = [
        ["grpc", "sentiment", 90, 0, 20, 40, 60, 70],
        ["grpc", "sentiment (paragraph)", 20, 0, 60, 90, 120, 130],
        ["grpc", "translate", 40, 0, 200, 300, 400, 420],
        ["grpc", "translate (paragraph)", 10, 0, 1200, 1800, 2000, 2100],
        ["", "Aggregated", 160, 0, 50, 1200, 1900, 2100],
    ]
    head = "Type,Name,Request Count,Failure Count,Requests/s,50%,95%,99%,Max Response Time"
    lines = [head] + [f"{t},{n},{r},{f},{r / 10},{p50},{p95},{p99},{m}" for t, n, r, f, p50, p95, p99, m in stats]
    (tmp_path / "locust_stats.csv").write_text("\n".join(lines) + "\n")
    history = ["Timestamp,User Count,Type,Name,50%,95%,99%,Total Request Count,Total Failure Count"]
    for second in range(5):
        for t, n, r, _, p50, p95, p99, _ in stats:
            history.append(f"{1000 + second},4,{t},{n},{p50},{p95},{p99},{r * (second + 1) // 5},0")
    (tmp_path / "locust_stats_history.csv").write_text("\n".join(history) + "\n")
    sentences = [("sentiment", 90, 90), ("sentiment (paragraph)", 20, 110), ("translate", 40, 40)]
    sentences += [("translate (paragraph)", 10, 61)]
    (tmp_path / "locust_sentences.json").write_text(
        json.dumps([{"type": "grpc", "name": n, "requests": r, "sentences": s} for n, r, s in sentences])
    )
    text, verdict = write_report(tmp_path, "locust", 0.01, 10_000, {"users": 4, "mix": "x", "paragraphs": 0.2})
    assert verdict.passed
    lines = text.splitlines()
    assert lines[0].split()[-1] == "sent."  # the mean sentences per request, a column of its own
    assert re.search(r"^grpc +translate +40 +0 .* 200 +300 +400 +420 +1\.0$", text, re.M), text
    assert re.search(r"^grpc +translate \(paragraph\) +10 +0 .* 1200 +1800 +2000 +2100 +6\.1$", text, re.M), text
    assert re.search(r"^grpc +sentiment \(paragraph\) +20 +0 .* 60 +90 +120 +130 +5\.5$", text, re.M), text
    assert "paragraphs: grpc translate p50 1200 ms vs 200 ms single (6.0x), p95 1800 vs 300 ms" in text
    assert "paragraphs: grpc sentiment p50 60 ms vs 20 ms single (3.0x)" in text
    summary = json.loads((tmp_path / "summary.json").read_text())
    by_name = {r["name"]: r for r in summary["rows"]}
    assert by_name["translate (paragraph)"]["paragraph"] is True and by_name["translate"]["paragraph"] is False
    assert by_name["translate (paragraph)"]["endpoint"] == "translate" and by_name["translate"]["sentences"] == 1
    assert by_name["sentiment (paragraph)"]["sentences"] == 5.5 and by_name["Aggregated"]["sentences"] == 301 / 160
    assert (tmp_path / "plot.png").read_bytes().startswith(b"\x89PNG")
    # without paragraph rows (PARAGRAPHS=0, or an older run without the sentences file): no comparison, no column
    plain = [Row("grpc", "translate", 40, 0, 4.0, 200, 300, 400, 420), Row("", "Aggregated", 40, 0, 4.0, 1, 1, 1, 1)]
    assert compare(plain) == [] and "sent." not in table(plain)
