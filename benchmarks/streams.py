"""Streams for minutes from one client process, as an application would send them through the SDK: what each stream
leaves behind in tritonserver, and whether the stream rate holds.

Each run starts a fresh server and has ``--threads`` threads of one process call ``Client.stream("translate", …,
num_beams=1)`` on the held-out sentences for ``--minutes``, reading tritonserver's resident memory every 10 s. A run
may abandon a share of its streams after their first piece (a user who closes the page). Reported per run:
streams, bytes per stream after the first minute (the growth from minute 1 to the end over the streams in between),
the first and last minute's streams/s and their ratio, and how the server stopped (exit code, seconds).

    python -m benchmarks.streams --minutes 3      # → benchmarks/results/streams.json
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.stats import machine
from clients import Client
from loadtest.texts import load_texts
from serving.launcher.embedded import EmbeddedTriton, ServerOptions, free_ports
from serving.launcher.processes import rss_mb

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_S = 10.0
# (protocol, share of streams abandoned after the first piece, ended by cancelling the gRPC call)
RUNS = (("grpc", 0.0, False), ("http", 0.0, False), ("grpc", 0.2, False))
# --cancelled: what a client that cancels its gRPC streams does to Triton 2.51 (clients/streaming.py `_end_stream`)
CANCELLED_RUNS = (("grpc", 0.0, True), ("grpc", 0.2, True))


def cancelled_stream(url: str, text: str, abandon: bool) -> str:
    """One greedy translate stream through bare tritonclient, ended with ``stop_stream(cancel_requests=True)``
    after its final response (or its first piece when ``abandon``): how tritonclient's examples end a stream."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    from clients.endpoints import to_infer_input

    arrays = (("TEXT", np.array([[text.encode()]], dtype=np.object_)), ("NUM_BEAMS", np.array([[1]], "i4")))
    inputs = [to_infer_input(name, array, grpcclient.InferInput) for name, array in arrays]
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("translate_stream", inputs, enable_empty_final_response=True)
        pieces = []
        while True:
            result, error = answers.get(timeout=60)
            if error is not None:
                raise error
            pieces.append(result.as_numpy("TRANSLATION"))
            if abandon or result.get_response().parameters["triton_final_response"].bool_param:
                break
        client.stop_stream(cancel_requests=True)
    return str(pieces)


def run(protocol: str, abandon: float, cancel: bool, minutes: float, threads: int, texts: list[str]) -> dict[str, Any]:
    http, grpc, metrics = free_ports(3)
    server = EmbeddedTriton(
        ServerOptions(model_repository=ROOT / "model_repository", http_port=http, grpc_port=grpc, metrics_port=metrics)
    )
    server.start()
    url = server.grpc_url if protocol == "grpc" else server.http_url
    done, failures, lock, stop = [0], [0], threading.Lock(), threading.Event()
    every = round(1 / abandon) if abandon else 0

    def worker(offset: int) -> None:
        with Client(url, protocol, retry=None, timeout_s=60) as client:
            n = offset
            while not stop.is_set():
                text = texts[n % len(texts)]
                try:
                    if cancel:
                        cancelled_stream(url, text, abandon=bool(every and n % every == 0))
                        with lock:
                            done[0] += 1
                        n += threads
                        continue
                    pieces = client.stream("translate", text, num_beams=1)
                    if every and n % every == 0:
                        next(pieces)
                        pieces.close()
                    else:
                        "".join(pieces)
                    with lock:
                        done[0] += 1
                except Exception:  # noqa: BLE001 - counted: a benchmark reports failures, it does not die of one
                    with lock:
                        failures[0] += 1
                    time.sleep(0.1)  # no busy loop against a server that is gone
                n += threads

    samples: list[tuple[float, int, float]] = []  # (seconds, streams so far, tritonserver MB)
    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    try:
        start = time.monotonic()
        for thread in pool:
            thread.start()
        while (elapsed := time.monotonic() - start) < minutes * 60:
            time.sleep(SAMPLE_S - elapsed % SAMPLE_S)
            with lock:
                samples.append((round(time.monotonic() - start, 1), done[0], round(rss_mb(server.pid), 2)))
            sample = {"protocol": protocol, "abandon": abandon, "cancel": cancel, "sample": samples[-1]}
            print(json.dumps(sample), flush=True)
        stop.set()
        for thread in pool:
            thread.join(timeout=90)
    finally:
        died = not server.is_alive
        stopping = time.monotonic()
        exit_code = server.stop()
    return {
        "protocol": protocol,
        "abandoned_share": abandon,
        "cancelled": cancel,
        "server_died": died,
        "threads": threads,
        "samples": samples,
        "failures": failures[0],
        "exit_code": exit_code,
        "stop_s": round(time.monotonic() - stopping, 1),
        **rates(samples),
    }


def rates(samples: list[tuple[float, int, float]]) -> dict[str, Any]:
    """Growth per stream after the first minute, and the last minute's rate against the first's."""
    minute = next((i for i, (t, *_) in enumerate(samples) if t >= 60), 0)
    t0, n0, m0 = samples[minute]
    t1, n1, m1 = samples[-1]
    tl, nl, _ = next(sample for sample in samples if sample[0] >= t1 - 60)  # the last minute's start
    first_rate = samples[minute][1] / samples[minute][0]
    last_rate = (n1 - nl) / (t1 - tl) if t1 > tl else first_rate
    return {
        "streams": n1,
        "bytes_per_stream": round((m1 - m0) * 1024 * 1024 / max(1, n1 - n0)),
        "first_minute_per_s": round(first_rate, 1),
        "last_minute_per_s": round(last_rate, 1),
        "rate_ratio": round(last_rate / first_rate, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.streams", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="minutes per run (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=8, help="streaming threads in the one client process")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data", help="test-set texts")
    parser.add_argument(
        "--cancelled",
        action="store_true",
        help="also end gRPC streams by cancelling them, as bare "
        "tritonclient does (Triton 2.51 keeps their state, and may abort: a server of its own per run)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "streams.json")
    args = parser.parse_args(argv)
    texts = load_texts(args.data_dir if args.data_dir.is_dir() else None)[0]["translate"]
    plan = RUNS + (CANCELLED_RUNS if args.cancelled else ())
    runs = [run(*settings, args.minutes, args.threads, texts) for settings in plan]
    args.out.write_text(json.dumps({"minutes": args.minutes, "machine": machine(), "runs": runs}, indent=2) + "\n")
    for r in runs:
        print(f"{r['protocol']:4} abandoned {r['abandoned_share']:.0%}{' cancelled' if r['cancelled'] else ''}: "
              f"{r['streams']} streams, server {'DIED' if r['server_died'] else 'up'}, "
              f"{r['bytes_per_stream']} B a stream, rate {r['rate_ratio']}x of the first minute, "
              f"{r['failures']} failures, exit {r['exit_code']} in {r['stop_s']} s", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
