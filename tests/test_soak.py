"""`make soak`: the drift verdict, and a short real run against the server (windows, memory, no failures)."""

from __future__ import annotations

import json

import pytest

from benchmarks import soak


def test_verdict_compares_late_windows_with_early_ones_after_the_warm_up():
    rows = [{"p99_ms": 900.0, "rss_mb": 100.0, "server_rss_mb": 10.0, "failures": 0}]  # warm-up: ignored
    rows += [{"p99_ms": 100.0, "rss_mb": 500.0, "server_rss_mb": 60.0, "failures": 0}] * 3
    rows += [{"p99_ms": 150.0, "rss_mb": 520.0, "server_rss_mb": 65.0, "failures": 1}] * 3
    assert soak.verdict(rows) == {"p99_drift": 1.5, "rss_growth_mb": 20.0, "server_rss_growth_mb": 5.0, "failures": 3}


@pytest.mark.server
def test_a_short_soak_reports_every_window(tmp_path):
    out = tmp_path / "soak.json"
    assert soak.main(["--minutes", "0.3", "--window", "4", "--clients", "4", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["windows"]) >= 4
    assert all(w["requests_per_s"] > 0 and w["rss_mb"] > 100 for w in result["windows"])
    # tritonserver alone: a real reading, and only part of the group (its stubs hold the models)
    assert all(0 < w["server_rss_mb"] < w["rss_mb"] / 2 for w in result["windows"])
    assert result["failures"] == 0
