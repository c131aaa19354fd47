"""`make soak`: the verdict against the bars, and a short real run against the server (every endpoint over both
protocols, per-window memory of tritonserver and each stub, no failures, a clean stop, the plot)."""

from __future__ import annotations

import json

import pytest

from benchmarks import soak


def rows(at_s: list[float], rps: float, p50: float, server: float) -> list[dict]:
    return [
        {"at_s": t, "requests_per_s": rps, "p50_ms": p50, "p99_ms": 2 * p50, "rss_mb": 10 * server,
         "server_rss_mb": server, "failures": 0}
        for t in at_s
    ]  # fmt: skip


def test_the_verdict_compares_the_last_sixth_with_the_early_windows_and_memory_over_the_second_half():
    minute = [60.0 * m for m in range(1, 61)]  # an hour of one-minute windows
    flat = rows(minute, 100, 20, 80)
    assert soak.verdict(flat, 3600)["passed"]
    slower = rows(minute[:50], 100, 20, 80) + rows(minute[50:], 85, 20, 80)  # the last 10 minutes 15% slower
    assert soak.verdict(slower, 3600)["throughput_ratio"] == 0.85
    assert not soak.verdict(slower, 3600)["passed"]
    growing = [dict(row, server_rss_mb=80 + 0.5 * i) for i, row in enumerate(flat)]  # 15 MB over the second half
    assert soak.verdict(growing, 3600)["server_rss_second_half_mb"] == 14.5
    assert not soak.verdict(growing, 3600)["passed"]
    tail = rows(minute[:50], 100, 20, 80) + rows(minute[50:], 100, 24, 80)  # p50 +20% at the end
    assert not soak.verdict(tail, 3600)["passed"]
    warm_up_ignored = rows(minute[:1], 10, 200, 40) + flat[1:]  # minute 1 is before the early windows
    assert soak.verdict(warm_up_ignored, 3600)["passed"]
    failing = [dict(row, failures=1) if i == 30 else row for i, row in enumerate(flat)]
    assert soak.verdict(failing, 3600)["failures"] == 1 and not soak.verdict(failing, 3600)["passed"]


@pytest.mark.server
def test_a_short_soak_sends_every_endpoint_over_both_protocols(tmp_path):
    out = tmp_path / "soak.json"
    assert soak.main(["--minutes", "0.4", "--window", "4", "--clients", "6", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["windows"]) >= 5
    windows = result["windows"]
    assert all(w["requests_per_s"] > 0 and w["rss_mb"] > 100 for w in windows)
    # tritonserver alone: a real reading, and only part of the group (its stubs hold the models)
    assert all(0 < w["server_rss_mb"] < w["rss_mb"] / 2 for w in windows)
    assert all(w["stubs_rss_mb"] and all(mb > 10 for mb in w["stubs_rss_mb"].values()) for w in windows)
    seen = {name for w in windows for name in w["endpoints"]}
    assert seen == {f"{endpoint} ({protocol})" for endpoint in soak.MIX for protocol in soak.PROTOCOLS}
    assert result["failures"] == 0
    assert result["exit_code"] == 0
    assert out.with_suffix(".png").stat().st_size > 10_000
