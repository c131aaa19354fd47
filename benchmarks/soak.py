"""`make soak`: a few minutes of steady mixed load on the real server; memory and p99 latency per window.

A soak asks whether anything drifts under load that a short test cannot see: memory that grows (a leak in the
engine's caches or the stubs), latency that creeps up (a queue that never drains). Closed-loop gRPC clients send
a fixed mix of the endpoints (sentiment, translate, summarize, translate_stream) with the load test's texts; every
window reports requests/s, p50 and p99 latency, failures, and the resident memory of tritonserver and its stubs
(all of them, and tritonserver alone: which side grows tells where to look).
The verdict compares the last windows with the first ones after a warm-up. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

from clients import Client, ClientError
from loadtest.texts import load_texts
from serving.embedded import EmbeddedTriton, ServerOptions, free_ports, group_rss_mb, rss_mb

ROOT = Path(__file__).resolve().parents[1]
MIX = {"sentiment": 6, "translate": 3, "summarize": 1, "translate_stream": 1}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Load:
    """Closed-loop clients; each finished request is recorded as (finish time, endpoint, seconds, ok)."""

    def __init__(self, url: str, clients: int, texts: dict[str, list[str]], seed: int = 0) -> None:
        self.url, self.texts = url, texts
        self.records: list[tuple[float, str, float, bool]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(seed + i,), daemon=True) for i in range(clients)]

    def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        endpoints, weights = list(MIX), list(MIX.values())
        with Client(self.url, retry=None, timeout_s=60) as client:
            while not self.stop.is_set():
                endpoint = rng.choices(endpoints, weights)[0]
                task = endpoint.removesuffix("_stream")
                text = rng.choice(self.texts[task])
                start = time.perf_counter()
                try:
                    if endpoint.endswith("_stream"):
                        "".join(client.stream(task, text, num_beams=1))
                    else:
                        client.infer(task, text)
                    ok = True
                except ClientError:
                    ok = False
                with self.lock:
                    self.records.append((time.monotonic(), endpoint, time.perf_counter() - start, ok))

    def window(self, since: float) -> list[tuple[float, str, float, bool]]:
        with self.lock:
            return [r for r in self.records if r[0] >= since]


def soak(minutes: float, window_s: float, clients: int, data_dir: Path | None) -> dict:
    texts, _ = load_texts(data_dir)
    http, grpc, metrics = free_ports(3)
    server = EmbeddedTriton(
        ServerOptions(model_repository=ROOT / "model_repository", http_port=http, grpc_port=grpc, metrics_port=metrics)
    )
    server.start()
    windows = []
    try:
        load = Load(server.grpc_url, clients, texts)
        for thread in load.threads:
            thread.start()
        end = time.monotonic() + minutes * 60
        while time.monotonic() < end:
            since = time.monotonic()
            time.sleep(window_s)
            records = load.window(since)
            latencies = [seconds for _, _, seconds, ok in records if ok]
            row = {
                "at_s": round(time.monotonic() - (end - minutes * 60), 1),
                "requests_per_s": round(len(records) / window_s, 1),
                "p50_ms": round(quantile(latencies, 0.5) * 1000, 1),
                "p99_ms": round(quantile(latencies, 0.99) * 1000, 1),
                "failures": sum(not ok for *_, ok in records),
                "rss_mb": round(group_rss_mb(server.pid), 1),
                "server_rss_mb": round(rss_mb(server.pid), 1),
            }
            windows.append(row)
            print(json.dumps(row), flush=True)
        load.stop.set()
        for thread in load.threads:
            thread.join(timeout=90)
    finally:
        server.stop()
    return {"clients": clients, "window_s": window_s, "mix": MIX, "windows": windows, **verdict(windows)}


def verdict(windows: list[dict]) -> dict:
    """Drift: the last third of the windows against the first third after the first window (the warm-up)."""
    steady = windows[1:]
    third = max(1, len(steady) // 3)
    early, late = steady[:third], steady[-third:]

    def median(rows: list[dict], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    return {
        "p99_drift": round(median(late, "p99_ms") / median(early, "p99_ms"), 3),
        "rss_growth_mb": round(median(late, "rss_mb") - median(early, "rss_mb"), 1),
        "server_rss_growth_mb": round(median(late, "server_rss_mb") - median(early, "server_rss_mb"), 1),
        "failures": sum(row["failures"] for row in windows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=4.0, help="load duration (default: %(default)s)")
    parser.add_argument("--window", type=float, default=20.0, help="seconds per reported window")
    parser.add_argument("--clients", type=int, default=16, help="concurrent closed-loop clients")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data", help="test-set texts")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak.json")
    args = parser.parse_args(argv)
    result = soak(args.minutes, args.window, args.clients, args.data_dir if args.data_dir.is_dir() else None)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"p99 drift {result['p99_drift']}x, memory {result['rss_growth_mb']:+.1f} MB "
          f"(tritonserver alone {result['server_rss_growth_mb']:+.1f} MB), "
          f"{result['failures']} failures → {args.out}", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
