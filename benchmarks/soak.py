"""`make soak MINUTES=60`: steady mixed load on the real server for minutes or hours; memory, throughput and latency
per window, per endpoint and protocol.

A soak asks whether anything drifts under load that a short test cannot see: memory that grows (a leak in the
engine's caches, the stubs or Triton's own frontends), latency that creeps up (a queue that never drains), a client
that slows down. Closed-loop clients send every endpoint in the mix, the streaming twins included, each request over
gRPC or HTTP at random (SDK clients, as users call them) with the load test's texts. Every window reports, overall
and per endpoint and protocol, requests/s, p50 and p99 latency and failures, and the resident memory of tritonserver
alone, of each stub and of the whole group: which side grows tells where to look. A plot of memory and throughput
over time is written beside the JSON.

The verdict holds the run to the bars of a day-long service, scaled to the run's length (for an hour: minutes 2–12
against the last 10 minutes, memory over the second half hour).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.stats import machine
from clients import Client, ClientError
from loadtest.texts import load_texts
from serving.launcher.embedded import EmbeddedTriton, ServerOptions, free_ports
from serving.launcher.processes import group_rss_mb, process_group_members, rss_mb
from serving.launcher.watchdog import find_stubs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MIX = {"sentiment": 6, "translate": 3, "summarize": 1, "translate_stream": 1, "summarize_stream": 1}
PROTOCOLS = ("grpc", "http")
# The streams as users watch them: greedy (token by token); summarize's stream is its generator's.
STREAM_OPTIONS = {"translate": {"num_beams": 1}, "summarize": {"mode": "abstractive", "num_beams": 1}}
# Bars for a service that runs for days (issue 38), as fractions of the run.
MAX_SERVER_GROWTH_MB = 5.0  # tritonserver over the second half
MAX_THROUGHPUT_DROP = 0.10  # last sixth against the early windows
MAX_P50_RISE = 0.15


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


Record = tuple[float, str, float, bool]  # (finish time, "endpoint (protocol)", seconds, ok)


class Load:
    """Closed-loop clients, each with one SDK client per protocol (an HTTP client holds one connection)."""

    def __init__(self, urls: dict[str, str], clients: int, texts: dict[str, list[str]], seed: int = 0) -> None:
        self.urls, self.texts = urls, texts
        self.records: list[Record] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(seed + i,), daemon=True) for i in range(clients)]

    def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        endpoints, weights = list(MIX), list(MIX.values())
        sdk = {protocol: Client(self.urls[protocol], protocol, retry=None, timeout_s=60) for protocol in PROTOCOLS}
        try:
            while not self.stop.is_set():
                endpoint, protocol = rng.choices(endpoints, weights)[0], rng.choice(PROTOCOLS)
                text = rng.choice(self.texts[endpoint])
                start = time.perf_counter()
                ok = self._send(sdk[protocol], endpoint, text)
                with self.lock:
                    self.records.append((time.monotonic(), f"{endpoint} ({protocol})", time.perf_counter() - start, ok))
        finally:
            for client in sdk.values():
                client.close()

    @staticmethod
    def _send(client: Client, endpoint: str, text: str) -> bool:
        task = endpoint.removesuffix("_stream")
        try:
            if endpoint.endswith("_stream"):
                return bool("".join(client.stream(task, text, **STREAM_OPTIONS[task])))
            client.infer(task, text)
            return True
        except ClientError:
            return False

    def window(self, since: float) -> list[Record]:
        with self.lock:
            return [r for r in self.records if r[0] >= since]


def summary(records: list[Record], window_s: float) -> dict[str, float]:
    latencies = [seconds for _, _, seconds, ok in records if ok]
    return {
        "requests_per_s": round(len(records) / window_s, 1),
        "p50_ms": round(quantile(latencies, 0.5) * 1000, 1),
        "p99_ms": round(quantile(latencies, 0.99) * 1000, 1),
        "failures": sum(not ok for *_, ok in records),
    }


def stub_rss_mb(server: EmbeddedTriton) -> dict[str, float]:
    """Resident MB of each stub, by instance name (a model's instances apart)."""
    stubs = find_stubs(process_group_members(server.pid))
    return {stub.instance or stub.model: round(rss_mb(stub.pid), 1) for stub in sorted(stubs, key=lambda s: s.instance)}


def soak(minutes: float, window_s: float, clients: int, data_dir: Path | None) -> dict[str, Any]:
    texts, _ = load_texts(data_dir)
    http, grpc, metrics = free_ports(3)
    server = EmbeddedTriton(
        ServerOptions(model_repository=ROOT / "model_repository", http_port=http, grpc_port=grpc, metrics_port=metrics)
    )
    server.start()
    windows = []
    try:
        load = Load({"grpc": server.grpc_url, "http": server.http_url}, clients, texts)
        for thread in load.threads:
            thread.start()
        begin = time.monotonic()
        end = begin + minutes * 60
        while time.monotonic() < end:
            since = time.monotonic()
            time.sleep(min(window_s, max(0.5, end - since)))
            elapsed = time.monotonic() - since
            records = load.window(since)
            per_endpoint: dict[str, list[Record]] = defaultdict(list)
            for record in records:
                per_endpoint[record[1]].append(record)
            row = {
                "at_s": round(time.monotonic() - begin, 1),
                **summary(records, elapsed),
                "rss_mb": round(group_rss_mb(server.pid), 1),
                "server_rss_mb": round(rss_mb(server.pid), 1),
                "stubs_rss_mb": stub_rss_mb(server),
                "endpoints": {name: summary(rows, elapsed) for name, rows in sorted(per_endpoint.items())},
            }
            windows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("endpoints", "stubs_rss_mb")}), flush=True)
        load.stop.set()
        for thread in load.threads:
            thread.join(timeout=90)
    finally:
        stop_started = time.monotonic()
        exit_code = server.stop()
    return {
        "minutes": minutes,
        "clients": clients,
        "window_s": window_s,
        "mix": MIX,
        "protocols": list(PROTOCOLS),
        "stream_options": STREAM_OPTIONS,
        "machine": machine(),
        "windows": windows,
        "exit_code": exit_code,
        "stop_s": round(time.monotonic() - stop_started, 1),
        **verdict(windows, minutes * 60),
    }


def verdict(windows: list[dict], total_s: float) -> dict[str, Any]:
    """The run against the bars, in fractions of its length: early windows end within (1/30, 1/5] of it (minutes
    2–12 of an hour), late ones in its last sixth, memory flatness over its second half."""

    def between(start: float, stop: float) -> list[dict]:
        return [row for row in windows if start * total_s < row["at_s"] <= stop * total_s]

    early = between(1 / 30, 1 / 5) or windows[1:2] or windows[:1]
    late = between(5 / 6, 1) or windows[-1:]
    half = between(1 / 2, 1) or windows[-2:]

    def median(rows: list[dict], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    result = {
        "throughput_ratio": round(median(late, "requests_per_s") / median(early, "requests_per_s"), 3),
        "p50_ratio": round(median(late, "p50_ms") / median(early, "p50_ms"), 3),
        "p99_drift": round(median(late, "p99_ms") / median(early, "p99_ms"), 3),
        "rss_growth_mb": round(median(late, "rss_mb") - median(early, "rss_mb"), 1),
        "server_rss_growth_mb": round(median(late, "server_rss_mb") - median(early, "server_rss_mb"), 1),
        "server_rss_second_half_mb": round(half[-1]["server_rss_mb"] - half[0]["server_rss_mb"], 1),
        "failures": sum(row["failures"] for row in windows),
    }
    result["passed"] = (
        result["failures"] == 0
        and result["server_rss_second_half_mb"] <= MAX_SERVER_GROWTH_MB
        and result["throughput_ratio"] >= 1 - MAX_THROUGHPUT_DROP
        and result["p50_ratio"] <= 1 + MAX_P50_RISE
    )
    return result


def plot(result: dict[str, Any], path: Path) -> Path:
    from benchmarks.plots import plt  # matplotlib, headless

    minutes = [row["at_s"] / 60 for row in result["windows"]]
    fig, (memory, load) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    memory.plot(minutes, [row["server_rss_mb"] for row in result["windows"]], label="tritonserver")
    stubs = sorted({name for row in result["windows"] for name in row["stubs_rss_mb"]})
    for name in stubs:
        memory.plot(minutes, [row["stubs_rss_mb"].get(name) for row in result["windows"]], lw=0.8, label=name)
    memory.set_ylabel("resident MB")
    memory.legend(fontsize=6, ncol=3)
    load.plot(minutes, [row["requests_per_s"] for row in result["windows"]], label="requests/s")
    load.set_ylabel("requests/s")
    latency = load.twinx()
    latency.plot(minutes, [row["p50_ms"] for row in result["windows"]], color="tab:orange", label="p50 ms")
    latency.set_ylabel("p50 ms")
    load.set_xlabel("minutes")
    fig.suptitle(f"soak: {result['minutes']:g} min, {result['clients']} clients, gRPC and HTTP")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=4.0, help="load duration (default: %(default)s)")
    parser.add_argument("--window", type=float, default=20.0, help="seconds per reported window (default: 20)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent closed-loop clients (default: 16)")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data", help="test-set texts")
    parser.add_argument("--out", type=Path, help="result JSON (default: benchmarks/results/soak_<minutes>min.json)")
    args = parser.parse_args(argv)
    out = args.out or RESULTS / f"soak_{args.minutes:g}min.json"
    result = soak(args.minutes, args.window, args.clients, args.data_dir if args.data_dir.is_dir() else None)
    out.write_text(json.dumps(result, indent=2) + "\n")
    picture = plot(result, out.with_suffix(".png"))
    print(f"{'passed' if result['passed'] else 'FAILED'}: throughput {result['throughput_ratio']}x, "
          f"p50 {result['p50_ratio']}x, p99 {result['p99_drift']}x, tritonserver "
          f"{result['server_rss_second_half_mb']:+.1f} MB over the second half, {result['failures']} failures, "
          f"exit {result['exit_code']} in {result['stop_s']} s → {out}, {picture}", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
