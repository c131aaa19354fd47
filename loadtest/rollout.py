"""A steady load on every endpoint and protocol that records what each request's client saw: for watching a rolling
update, a lost replica or a scale change from the client's side.

One worker per (endpoint, protocol): `sentiment`, `translate`, `summarize` and the streaming twins, over gRPC and
HTTP, each with its own SDK client and the SDK's default retry policy. Each finished request is one JSON line:

    {"endpoint": "translate", "protocol": "grpc", "start": 1765000000.1, "end": 1765000000.4,
     "ok": true, "retries": 0, "error": null}

`retries` counts the SDK's retries of that request (its "ropeserve.client" log records); a streamed request is
not retried by the SDK, so a failed stream is a failure. `tally` reads the lines back for a window of time.

    python -m loadtest.rollout --grpc-host triton:8001 --host http://triton:8000 --log requests.jsonl --duration 10m
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from clients import Client
from loadtest.run import parse_duration
from loadtest.texts import endpoints, is_stream, load_texts, task_of

PROTOCOLS = ("grpc", "http")


class RetryCounter(logging.Handler):
    """Counts the SDK's retry records per thread: each worker thread runs one request at a time."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counts: dict[int, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[threading.get_ident()] = self.counts.get(threading.get_ident(), 0) + 1

    def take(self) -> int:
        return self.counts.pop(threading.get_ident(), 0)


def request_once(client: Client, endpoint: str, text: str) -> None:
    if is_stream(endpoint):
        if not "".join(client.stream(task_of(endpoint), text)).strip():
            raise RuntimeError("the stream ended without text")
    else:
        client.infer(endpoint, text)


def worker(url: str, protocol: str, endpoint: str, texts: list[str], until: threading.Event, log: Any,
           lock: threading.Lock, retries: RetryCounter, timeout_s: float, pause_s: float) -> None:  # fmt: skip
    with Client(url, protocol=protocol, timeout_s=timeout_s) as client:
        turn = 0
        while not until.is_set():
            text = texts[turn % len(texts)]
            turn += 1
            start, error = time.time(), None
            try:
                request_once(client, endpoint, text)
            except Exception as failure:  # noqa: BLE001 - every failure is what the client saw: record it
                error = f"{type(failure).__name__}: {failure}"[:300]
            line = {"endpoint": endpoint, "protocol": protocol, "start": start, "end": time.time(),
                    "ok": error is None, "retries": retries.take(), "error": error}  # fmt: skip
            with lock:
                log.write(json.dumps(line) + "\n")
                log.flush()
            until.wait(pause_s if error is None else max(pause_s, 0.2))  # a failure returns at once: do not spin


def run(grpc_url: str, http_url: str, log_path: Path, duration_s: float, stop_file: Path | None,
        timeout_s: float, pause_s: float) -> None:  # fmt: skip
    texts, _ = load_texts(None)
    retries = RetryCounter()
    logging.getLogger("ropeserve.client").addHandler(retries)
    logging.getLogger("ropeserve.client").setLevel(logging.INFO)
    until, lock = threading.Event(), threading.Lock()
    with open(log_path, "a", encoding="utf-8") as log:
        threads = [
            threading.Thread(
                target=worker,
                args=(
                    grpc_url if protocol == "grpc" else http_url,
                    protocol,
                    endpoint,
                    texts[endpoint],
                    until,
                    log,
                    lock,
                    retries,
                    timeout_s,
                    pause_s,
                ),  # fmt: skip
                daemon=True,
            )
            for endpoint in endpoints()
            for protocol in PROTOCOLS
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline and not (stop_file and stop_file.exists()):
            time.sleep(0.2)
        until.set()
        for thread in threads:
            thread.join(timeout=timeout_s + 5)


def read(log_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines() if line.strip()]


def tally(requests: Iterable[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """What the clients saw of the requests that ran at some moment of [start, end): sent, answered, retried
    (answered after at least one retry), failed, their errors; and the throughput (answers that arrived in the
    window, per second) and median latency of the answered ones."""
    inside = [r for r in requests if r["start"] < end and r["end"] >= start]
    answered = [r for r in inside if r["ok"]]
    latencies = [r["end"] - r["start"] for r in answered]
    seconds = end - start
    return {
        "sent": len(inside),
        "answered": len(answered),
        "retried": sum(1 for r in answered if r["retries"]),
        "failed": len(inside) - len(answered),
        "errors": sorted({r["error"] for r in inside if not r["ok"]}),
        "seconds": round(seconds, 1),
        "answered_per_s": round(sum(1 for r in answered if r["end"] < end) / seconds, 2) if seconds > 0 else 0.0,
        "p50_ms": round(statistics.median(latencies) * 1000, 1) if latencies else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--grpc-host", default="127.0.0.1:8001", help="Triton's gRPC address (default: %(default)s)")
    parser.add_argument("--host", default="http://127.0.0.1:8000", help="Triton's HTTP URL (default: %(default)s)")
    parser.add_argument("--log", type=Path, required=True, help="JSON lines, one per request, appended")
    parser.add_argument("--duration", type=parse_duration, default="10m",
                        help="how long to run: 90s, 10m, 1h (default: %(default)s)")  # fmt: skip
    parser.add_argument("--stop-file", type=Path, help="stop as soon as this file exists (before --duration ends)")
    parser.add_argument("--timeout", type=float, default=60.0, help="each request's timeout in seconds")
    parser.add_argument("--pause", type=float, default=0.1,
                        help="seconds each worker waits between its requests: a load that leaves the CPU room to start "
                             "a replica (default: %(default)s)")  # fmt: skip
    args = parser.parse_args(argv)
    run(args.grpc_host, args.host, args.log, args.duration, args.stop_file, args.timeout, args.pause)


if __name__ == "__main__":
    main()
