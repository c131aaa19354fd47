"""`make loadtest`: real locust (gRPC + HTTP users) against the embedded server, its files, summary and verdict."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest

from loadtest.report import Row, judge
from loadtest.texts import endpoints, inputs_for, load_texts, parse_mix

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
    run = make_loadtest(triton, tmp_path, 120, DURATION="10s", MAX_FAILURE_RATIO="0", MAX_P99_MS="60000")
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
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"] is True and summary["settings"]["users"] == 4
    # the table is printed, with the verdict
    assert "Aggregated" in run.stdout and "p99 ms" in run.stdout and "PASS" in run.stdout
    log = (out / "locust.log").read_text()
    assert "Traceback" not in log, log[-2000:]
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
