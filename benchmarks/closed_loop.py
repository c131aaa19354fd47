"""Closed-loop gRPC clients of `translate` and `translate_stream` for the served benchmark sections
(benchmarks/translation.py, benchmarks/documents.py): each client thread sends one text per request and the next as
soon as the answer is in; with the cores each process used while they ran. A streamed request goes through the
SDK's own gRPC stream (clients/streaming.py `grpc_stream`: a stream per request, closed without cancelling), so
the streaming figures are what an application on the SDK gets.

A request the server refuses for overload (UNAVAILABLE: the queue or the engine's backlog is full) is sent again
after the SDK's backoff (clients/retry.py), as an application on the SDK would; its latency counts from the first
send. Refusals are counted apart from errors: a refusal is the overload safeguard at work, an error is a fault.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.cpu_share import cores_during
from benchmarks.stats import percentile
from clients.errors import to_client_error
from clients.retry import RetryPolicy
from clients.streaming import grpc_stream

OUTPUT = "TRANSLATION"
REQUEST_TIMEOUT_S = 120.0
CORES = "cores "  # prefix of a served point's CPU figures: "cores tritonserver", "cores stub translate", …
LOAD = "load (this process)"  # the client threads
RETRY = RetryPolicy()  # the SDK's default: what a refused request of an SDK user goes through
# The answer lengths closed_loop reports: over all requests, and over those at or above the p99 latency.
TAIL_WORDS = ("answer_words_p50", "slowest_answer_words_p50")


# -- served ---------------------------------------------------------------------------------------------------


def _inputs(text: str, beams: int, new_tokens: int) -> list[Any]:
    import numpy as np
    import tritonclient.grpc as grpcclient

    from clients.endpoints import to_infer_input

    arrays = (
        ("TEXT", np.array([[text.encode("utf-8")]], dtype=np.object_)),
        ("NUM_BEAMS", np.array([[beams]], dtype=np.int32)),
        ("MAX_NEW_TOKENS", np.array([[new_tokens]], dtype=np.int32)),
    )
    return [to_infer_input(name, array, grpcclient.InferInput) for name, array in arrays]


def _streamed(url: str, task: str, text: str, beams: int, new_tokens: int) -> tuple[float, float, str]:
    """One streamed answer through the SDK: (time of the first non-empty piece, time of the final response, the
    pieces joined); an answer whose pieces are all empty gets the final response's time for both."""
    first = None
    pieces: list[str] = []
    options = {"num_beams": beams, "max_new_tokens": new_tokens}
    for piece in grpc_stream(url, REQUEST_TIMEOUT_S, task, text, options):
        if piece and first is None:
            first = time.perf_counter()
        pieces.append(piece)
    done = time.perf_counter()
    return (first if first is not None else done), done, "".join(pieces)


def closed_loop(
    url: str,
    model: str,
    texts: Sequence[str],
    clients: int,
    beams: int,
    new_tokens: int,
    seconds: float,
    warmup_s: float,
    stream: bool = False,
) -> dict[str, Any]:
    """``clients`` threads, each with its own tritonclient gRPC client, sending one text per request and the next
    as soon as the answer is in, for ``warmup_s`` + ``seconds``; requests sent during the warm-up are not counted.
    With ``stream``, ``model`` names the task, whose streaming twin answers. Throughput = counted requests /
    seconds; latencies from the first send to the (final) response, and with ``stream`` the time to the first
    non-empty piece. What makes the tail: the median answer length in words over all requests and over those at or
    above the p99 latency. ``refusals``: overload refusals that were retried; ``errors``: requests that failed for
    good (refused after the SDK's last attempt included), the first one's message in ``first_error``."""
    import tritonclient.grpc as grpcclient

    records: list[tuple[float, float, int]] = []  # (full latency, time to first piece, answer words)
    cycle = itertools.cycle(texts)  # shared: the texts go out in file order whatever the client count
    errors = refusals = 0
    first_error: list[str] = []
    lock = threading.Lock()
    clock: dict[str, float] = {}

    def set_clock() -> None:  # when every client is connected: the window starts for all at once
        clock["measure_from"] = time.perf_counter() + warmup_s
        clock["stop_at"] = clock["measure_from"] + seconds

    gate = threading.Barrier(clients, action=set_clock)

    def worker(index: int) -> None:
        nonlocal errors, refusals
        client = grpcclient.InferenceServerClient(url)
        outputs = [grpcclient.InferRequestedOutput(OUTPUT)]
        mine: list[tuple[float, float, int]] = []
        failed = refused = 0
        try:
            try:
                gate.wait(timeout=REQUEST_TIMEOUT_S)
            except BaseException:
                gate.abort()  # the other clients stop waiting for this one
                raise
            while (sent := time.perf_counter()) < clock["stop_at"]:
                with lock:
                    text = next(cycle)
                inputs = None if stream else _inputs(text, beams, new_tokens)
                answer = None
                for attempt in itertools.count(1):
                    try:
                        if stream:
                            first, done, answer = _streamed(url, model, text, beams, new_tokens)
                        else:
                            result = client.infer(model, inputs, outputs=outputs, client_timeout=REQUEST_TIMEOUT_S)
                            first = done = time.perf_counter()
                            answer = result.as_numpy(OUTPUT).reshape(-1)[0].decode("utf-8")
                        break
                    except Exception as error:  # noqa: BLE001 - counted and reported: a benchmark must not die
                        known = to_client_error(error, url, REQUEST_TIMEOUT_S)
                        if known is not None and RETRY.is_retryable(known) and attempt < RETRY.max_attempts:
                            refused += 1
                            time.sleep(RETRY.delay(attempt))
                            continue
                        failed += 1
                        with lock:
                            first_error[:] = first_error or [str(known or error)]
                        time.sleep(0.01)  # no busy loop against a server that refuses everything
                        break
                if answer is None:
                    continue
                if sent >= clock["measure_from"]:
                    mine.append((done - sent, first - sent, len(answer.split())))
        finally:
            with contextlib.suppress(Exception):
                client.close()
            with lock:
                records.extend(mine)
                errors += failed
                refusals += refused

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if not records:
        raise RuntimeError(
            f"no request to {model} was both sent in the {seconds:g} s window and answered, with {clients} clients "
            f"({errors} errors{'; the first: ' + first_error[0] if first_error else ''}); a window shorter than one "
            "answer's latency counts nothing"
        )
    full = [r[0] for r in records]
    p99 = percentile(full, 99)
    out: dict[str, Any] = {
        "throughput": len(records) / seconds,
        "p50_ms": percentile(full, 50) * 1e3,
        "p99_ms": p99 * 1e3,
        "requests": len(records),
        "errors": errors,
        "refusals": refusals,
        "answer_words_p50": statistics.median(r[2] for r in records),
        "slowest_answer_words_p50": statistics.median(r[2] for r in records if r[0] >= p99),
    }
    if first_error:
        out["first_error"] = first_error[0]
    if stream:
        ttft = [r[1] for r in records]
        out |= {
            "ttft_p50_ms": percentile(ttft, 50) * 1e3,
            "ttft_p99_ms": percentile(ttft, 99) * 1e3,
            "ttft_share_median": statistics.median(t / f for f, t, _ in records if f > 0),
        }
    return out


def with_cores(load: Callable[[], dict[str, float]]) -> dict[str, float]:
    """The load's result and the cores each process used while it ran (CPU seconds ÷ wall seconds): tritonserver,
    each model's Python stubs, and this process, whose client threads are the load. Where a served sentence's CPU
    goes is what sets the served figures against the offline ones."""
    began, own = time.monotonic(), time.process_time()
    result, cores = cores_during(load, interval_s=1.0)  # the servers outlive the load: few samples suffice
    cores[LOAD] = (time.process_time() - own) / (time.monotonic() - began)
    return result | {f"{CORES}{kind}": used for kind, used in cores.items()}


def start_server(stack: contextlib.ExitStack, repository: Path, models: list[str]) -> Any:
    """The embedded server on free ports, serving `models` of `repository`, stopped when `stack` closes."""
    from serving.launcher.embedded import EmbeddedTriton, ServerOptions, free_ports

    http, grpc, metrics = free_ports(3)
    options = ServerOptions(
        model_repository=repository, http_port=http, grpc_port=grpc, metrics_port=metrics, models=models
    )
    return stack.enter_context(EmbeddedTriton(options))
