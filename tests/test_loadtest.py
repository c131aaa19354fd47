"""`make loadtest`: real locust (gRPC + HTTP users) against the embedded server, its files, summary and verdict."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import urllib.request
from functools import partial
from pathlib import Path

import pytest
from prometheus_text import metric_sum, metric_values, settled

from loadtest.report import Row, compare, judge, stream_table, table, write_report
from loadtest.run import build_parser, locust_command
from loadtest.texts import (
    DEFAULT_PARAGRAPHS,
    Picker,
    default_mix,
    endpoints,
    inputs_for,
    join_sentences,
    keywords_for,
    load_texts,
    paragraph_endpoints,
    parse_mix,
    parse_paragraphs,
    stream_endpoints,
    task_of,
)

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


STREAM_MIX = "translate_stream:1,summarize_stream:1,translate:1"


def test_make_loadtest_streams_the_twins_over_both_protocols(triton, tmp_path):
    """The streaming twins in the mix: gRPC streams and HTTP generate_stream, each answer's first piece, gaps and
    whole time in the streams file and the report, no failure."""
    run = make_loadtest(triton, tmp_path, 120, DURATION="6s", MIX=STREAM_MIX, MAX_FAILURE_RATIO="0", MAX_P99_MS="60000")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (out,) = list(tmp_path.iterdir())
    log = (out / "locust.log").read_text()
    assert "Traceback" not in log, log[-2000:]
    with open(out / "locust_stats.csv", newline="") as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    twins = [(kind, name) for kind in ("grpc", "POST") for name in ("translate_stream", "summarize_stream")]
    for key in [*twins, ("grpc", "translate"), ("POST", "translate")]:
        assert key in rows and int(rows[key]["Request Count"]) > 0, (key, sorted(rows))
    assert int(rows[("", "Aggregated")]["Failure Count"]) == 0
    # every streamed answer: a first piece after > 0 ms, no later than the whole answer
    streams = json.loads((out / "locust_streams.json").read_text())
    samples = {(r["type"], r["name"]): r["samples"] for r in streams["rows"]}
    for key in twins:
        # every request timed (locust's CSV is written up to a second before the last requests end: fewer or equal)
        assert len(samples[key]) >= int(rows[key]["Request Count"]), key
        assert all(0 < s[1] <= s[3] and s[4] >= 1 for s in samples[key]), key
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"] is True
    by_key = {(r["type"], r["name"]): r for r in summary["rows"]}
    for key in twins:
        row = by_key[key]
        assert row["stream"] is True and row["failures"] == 0 and row["streams"] >= row["requests"], row
        assert 0 < row["first_p50_ms"] <= row["whole_p50_ms"] and 0 < row["first_p99_ms"] <= row["whole_p99_ms"], row
    for kind in ("grpc", "POST"):  # greedy translation streams token by token, read as the pieces come
        row = by_key[(kind, "translate_stream")]
        assert row["pieces"] > 1 and row["gap_p50_ms"] >= 1 and row["first_p50_ms"] < row["whole_p50_ms"], row
    assert by_key[("grpc", "translate")]["stream"] is False and by_key[("grpc", "translate")]["first_p50_ms"] is None
    # the printed report: the twins' rows, and the streams table with their first-piece columns
    assert "streams (ms): first = to the first non-empty piece" in run.stdout, run.stdout
    for kind, name in twins:
        assert re.search(rf"^{kind} +{name} +{by_key[(kind, name)]['streams']} +\d+ +\d+ ", run.stdout, re.M), (
            run.stdout
        )
    height = int.from_bytes((out / "plot.png").read_bytes()[20:24], "big")
    paragraphs = any(name.endswith("(paragraph)") for _, name in rows)  # their own panel
    assert height == 325 * (2 + paragraphs + 1), height  # and one of the streams' first piece and whole answer
    print(run.stdout)


def test_make_loadtest_targets_the_gateway_routes(triton, gateway, tmp_path):
    """PROTOCOLS=gateway: DeepL's /v2/translate, /v1/<task> and /v1/<task>/stream, under the endpoints' names."""
    mix = "translate:1,sentiment:1,summarize:1,translate_stream:1"
    run = make_loadtest(
        triton, tmp_path, 120, DURATION="6s", MIX=mix, PROTOCOLS="gateway", GATEWAY_HOST=gateway.url,
        MAX_FAILURE_RATIO="0", MAX_P99_MS="60000",
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (out,) = list(tmp_path.iterdir())
    with open(out / "locust_stats.csv", newline="") as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    for name in ("translate", "sentiment", "summarize", "translate_stream"):
        assert int(rows[("gateway", name)]["Request Count"]) > 0, sorted(rows)
    assert int(rows[("", "Aggregated")]["Failure Count"]) == 0
    streams = json.loads((out / "locust_streams.json").read_text())
    [timed] = [r["samples"] for r in streams["rows"] if (r["type"], r["name"]) == ("gateway", "translate_stream")]
    assert timed and all(0 < s[1] <= s[3] for s in timed)
    with urllib.request.urlopen(f"{gateway.url}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert metric_values(metrics, "ropeserve_gateway_requests_total", route="/v2/translate", status="200")


def test_make_loadtest_fails_when_p99_is_over_the_limit(triton, tmp_path):
    run = make_loadtest(triton, tmp_path, 90, DURATION="4s", USERS="2", MAX_P99_MS="1", MIX="sentiment:1")
    assert run.returncode != 0
    assert "FAIL: p99" in run.stdout and "> limit 1 ms" in run.stdout, run.stdout[-2000:]
    (out,) = list(tmp_path.iterdir())
    assert json.loads((out / "summary.json").read_text())["passed"] is False


def test_requests_the_server_refuses_are_counted_as_failures(triton, tmp_path):
    """NUM_BEAMS 9 is out of translate's range [1, 8]: every request is refused with 400 / INVALID_ARGUMENT, and
    locust must count each one, over both protocols, for the run to fail on its failure ratio."""
    settings = {"DURATION": "3s", "USERS": "2", "MIX": "translate:1", "NUM_BEAMS": "9", "PARAGRAPHS": "0"}
    run = make_loadtest(triton, tmp_path, 90, **settings)
    assert run.returncode != 0
    assert "FAIL: failure ratio 1.0000" in run.stdout, run.stdout[-2000:]
    (out,) = list(tmp_path.iterdir())
    rows = json.loads((out / "summary.json").read_text())["rows"]
    per_protocol = [row for row in rows if row["name"] != "Aggregated"]
    assert {row["type"] for row in per_protocol} == {"grpc", "POST"}  # locust names HTTP requests by method
    assert all(row["requests"] > 0 and row["failures"] == row["requests"] for row in per_protocol), per_protocol


def test_mix_texts_and_verdict():
    assert parse_mix("sentiment:6,translate:3") == {
        "sentiment": 6.0,
        "translate": 3.0,
        "summarize": 0.0,
        "summarize_stream": 0.0,
        "translate_stream": 0.0,
    }
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
    # summarize's texts are articles already; a streaming twin sends its task's texts
    assert sorted(paragraph_endpoints()) == ["sentiment", "translate", "translate_stream"]
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


def write_locust_csvs(folder: Path, stats: list[list], seconds: int) -> None:
    """locust's stats and history CSV files for rows [type, name, requests, failures, p50, p95, p99, max], the
    requests spread evenly over `seconds` history rows."""
    head = "Type,Name,Request Count,Failure Count,Requests/s,50%,95%,99%,Max Response Time"
    lines = [head] + [f"{t},{n},{r},{f},{r / 10},{p50},{p95},{p99},{m}" for t, n, r, f, p50, p95, p99, m in stats]
    (folder / "locust_stats.csv").write_text("\n".join(lines) + "\n")
    history = ["Timestamp,User Count,Type,Name,50%,95%,99%,Total Request Count,Total Failure Count"]
    for second in range(seconds):
        for t, n, r, _, p50, p95, p99, _ in stats:
            history.append(f"{1000 + second},4,{t},{n},{p50},{p95},{p99},{r * (second + 1) // seconds},0")
    (folder / "locust_stats_history.csv").write_text("\n".join(history) + "\n")


def test_report_keeps_paragraph_rows_apart(tmp_path):
    """locust's CSV files of a run with paragraphs → a table row, a comparison line, summary rows and a plot."""
    stats = [
        ["grpc", "sentiment", 90, 0, 20, 40, 60, 70],
        ["grpc", "sentiment (paragraph)", 20, 0, 60, 90, 120, 130],
        ["grpc", "translate", 40, 0, 200, 300, 400, 420],
        ["grpc", "translate (paragraph)", 10, 0, 1200, 1800, 2000, 2100],
        ["", "Aggregated", 160, 0, 50, 1200, 1900, 2100],
    ]
    write_locust_csvs(tmp_path, stats, seconds=5)
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


def test_mix_takes_the_streaming_twins_with_their_tasks_texts_and_options():
    assert stream_endpoints() == {"summarize_stream": "summarize", "translate_stream": "translate"}
    weights = parse_mix("translate_stream:1,summarize_stream:1,translate:1")
    assert {name for name, weight in weights.items() if weight} == {"translate_stream", "summarize_stream", "translate"}
    assert "_stream" not in default_mix()  # the default mix leaves the twins out
    assert task_of("translate_stream") == "translate" and task_of("sentiment") == "sentiment"
    texts, _ = load_texts(None)
    assert texts["translate_stream"] is texts["translate"] and texts["summarize_stream"] is texts["summarize"]
    values = {"num_beams": 1, "max_new_tokens": 8}
    assert (
        inputs_for("translate_stream", values)
        == inputs_for("translate", values)
        == {
            "NUM_BEAMS": 1,
            "MAX_NEW_TOKENS": 8,
        }
    )
    assert keywords_for("translate_stream", values) == values and keywords_for("sentiment", values) == {}
    picker = Picker(texts, weights, 0.5, seed=3)
    names = {picker.pick().name for _ in range(500)}
    assert names == {"translate", "translate (paragraph)", "translate_stream", "translate_stream (paragraph)"} | {
        "summarize_stream"
    }


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_report_shows_streams_apart_with_first_piece_gap_and_whole(tmp_path):
    """locust's CSV files and the locustfile's streams file of a run with streaming twins → the twins' rows after the
    unary ones, a streams table (first piece, between pieces, whole: p50/p99), summary fields and a plot panel."""
    stats = [
        ["grpc", "translate_stream", 100, 0, 400, 700, 900, 950],
        ["POST", "summarize_stream", 50, 1, 800, 1000, 1200, 1300],
        ["grpc", "translate", 80, 0, 300, 500, 600, 650],
        ["", "Aggregated", 230, 1, 400, 900, 1100, 1300],
    ]
    write_locust_csvs(tmp_path, stats, seconds=20)
    # translate_stream over gRPC: 100 answers, first piece 1..100 ms, gaps 10..109 ms, whole 201..300 ms, 5 pieces;
    # summarize_stream over HTTP: 49 answers of one piece (no gap), first piece = whole = 500..548 ms
    translate = [[1000.5 + k / 5, k + 1, 10 + k, 201 + k, 5] for k in range(100)]
    summarize = [[1001 + k / 5, 500 + k, None, 500 + k, 1] for k in range(49)]
    rows = [
        {"type": "grpc", "name": "translate_stream", "samples": translate},
        {"type": "POST", "name": "summarize_stream", "samples": summarize},
    ]
    fields = ["end", "first_ms", "gap_ms", "whole_ms", "pieces"]
    (tmp_path / "locust_streams.json").write_text(json.dumps({"fields": fields, "rows": rows}))
    text, verdict = write_report(tmp_path, "locust", 0.01, 10_000, {"users": 4, "mix": "x", "paragraphs": 0})
    assert verdict.passed
    lines = text.splitlines()
    # the locust table: the unary endpoint first, then the twins (their whole answers), then Aggregated
    names = [line[7:].split()[0] for line in lines[2:6]]
    assert names == ["translate", "translate_stream", "summarize_stream", "Aggregated"], text
    assert "streams (ms): first = to the first non-empty piece" in text
    stream_head = next(line for line in lines if line.startswith("type ") and "first p50" in line)
    assert stream_head.split()[3:] == ["first", "p50", "first", "p99", "gap", "p50", "gap", "p99"] + [
        "whole",
        "p50",
        "whole",
        "p99",
        "pieces",
    ]
    assert re.search(r"^grpc +translate_stream +100 +50 +99 +59 +108 +250 +299 +5\.0$", text, re.M), text
    assert re.search(r"^POST +summarize_stream +49 +524 +548 +- +- +524 +548 +1\.0$", text, re.M), text
    summary = json.loads((tmp_path / "summary.json").read_text())
    by_name = {r["name"]: r for r in summary["rows"]}
    assert by_name["translate_stream"]["stream"] is True and by_name["translate"]["stream"] is False
    assert by_name["translate_stream"]["streams"] == 100 and by_name["translate_stream"]["first_p50_ms"] == 50
    assert by_name["translate_stream"]["first_p99_ms"] == 99 and by_name["translate_stream"]["gap_p50_ms"] == 59
    assert by_name["translate_stream"]["whole_p50_ms"] == 250 and by_name["translate_stream"]["whole_p99_ms"] == 299
    assert by_name["summarize_stream"]["gap_p50_ms"] is None and by_name["summarize_stream"]["pieces"] == 1
    assert by_name["translate"]["first_p50_ms"] is None and by_name["translate"]["streams"] == 0
    # the plot: a panel of the streams' first piece and whole answer over time, below the two of every run
    with_streams = _png_size(tmp_path / "plot.png")
    (tmp_path / "locust_streams.json").unlink()
    text, _ = write_report(tmp_path, "locust", 0.01, 10_000, {"users": 4, "mix": "x", "paragraphs": 0})
    assert with_streams[1] > _png_size(tmp_path / "plot.png")[1] * 1.3
    # without the streams file (no streamed answer succeeded), the twins' rows say so; without twins, no table
    assert re.search(r"^grpc +translate_stream +0 +- +- +- +- +- +- +-$", text, re.M), text
    assert stream_table([Row("grpc", "translate", 1, 0, 1, 1, 1, 1, 1)]) == ""


def test_rollout_tally_counts_what_ran_in_the_window_as_the_client_saw_it():
    from loadtest.rollout import tally

    def request(start: float, end: float, ok: bool = True, retries: int = 0) -> dict:
        error = None if ok else "ServerUnreachable: reset"
        return {"endpoint": "translate", "protocol": "grpc", "start": start, "end": end, "ok": ok, "retries": retries,
                "error": error}  # fmt: skip

    requests = [
        request(0.0, 0.5),  # before the window: not counted
        request(0.9, 1.2, retries=1),  # running as the window opens: counted, and it was retried
        request(1.5, 1.6, ok=False),
        request(1.7, 1.9),
        request(2.8, 3.4),  # running as the window closes: counted, but its answer came after it
    ]
    counts = tally(requests, 1.0, 3.0)
    assert (counts["sent"], counts["answered"], counts["retried"], counts["failed"]) == (4, 3, 1, 1)
    assert counts["errors"] == ["ServerUnreachable: reset"]
    assert counts["answered_per_s"] == 1.0  # two answers arrived inside the 2 s window
    assert counts["p50_ms"] == 300.0
    assert tally([], 0.0, 1.0)["p50_ms"] is None


def test_rollout_refuses_a_bad_duration_by_name():
    run = subprocess.run([sys.executable, "-m", "loadtest.rollout", "--log", "x.jsonl", "--duration", "soon"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2 and "duration" in run.stderr
