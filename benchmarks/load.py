"""Closed-loop load from asyncio: ``concurrency`` workers, each sending its next request when the last returns.

The same driver measures the Triton endpoint (through the project's ``clients.AsyncClient``) and the FastAPI
baseline (through aiohttp), so the two differ only in the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.profiles import ROOT
from benchmarks.stats import percentile

WARMUP_S = 0.5


async def drive(
    call: Callable[[str], Awaitable[Any]],
    texts: list[str],
    concurrency: int,
    seconds: float,
    warmup_s: float = WARMUP_S,
) -> dict:
    """Throughput and latency percentiles of ``call`` under ``concurrency`` concurrent workers.

    Requests sent in the first ``warmup_s`` seconds are not counted (connections, first batches).
    """
    cycle = itertools.cycle(texts)
    latencies: list[float] = []
    errors = 0
    start = time.perf_counter()
    measure_from, stop_at = start + warmup_s, start + warmup_s + seconds

    async def worker() -> None:
        nonlocal errors
        while (sent := time.perf_counter()) < stop_at:
            try:
                await call(next(cycle))
            except Exception:  # noqa: BLE001  (counted and reported: a benchmark must not die on one failure)
                errors += 1
                continue
            if sent >= measure_from:
                latencies.append(time.perf_counter() - sent)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    if not latencies:
        raise RuntimeError(f"no request succeeded at concurrency {concurrency} ({errors} errors)")
    return figures(latencies, errors, seconds)


def figures(latencies: list[float], errors: int, seconds: float) -> dict:
    """Requests answered a second over ``seconds``, latency percentiles (ms), requests and errors."""
    return {
        "throughput": len(latencies) / seconds,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p90_ms": percentile(latencies, 90) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "requests": len(latencies),
        "errors": errors,
    }


async def drive_triton(
    grpc_url: str, texts: list[str], concurrency: int, seconds: float, warmup_s: float = WARMUP_S
) -> dict:
    from clients import AsyncClient

    async with AsyncClient(grpc_url, protocol="grpc", retry=None) as client:
        return await drive(client.sentiment, texts, concurrency, seconds, warmup_s)


async def drive_http_json(
    url: str, texts: list[str], concurrency: int, seconds: float, warmup_s: float = WARMUP_S
) -> dict:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def call(text: str) -> Any:
            async with session.post(url, json={"text": text}) as response:
                response.raise_for_status()
                return await response.json()

        return await drive(call, texts, concurrency, seconds, warmup_s)


@contextlib.contextmanager
def fastapi_server(port: int, ready_timeout_s: float = 60.0) -> Iterator[str]:
    """Run the FastAPI baseline in its own uvicorn process; yields its /sentiment URL; stops it after."""
    command = [sys.executable, "-m", "uvicorn", "benchmarks.fastapi_app:app", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"ropeserve-fastapi-{port}.log", "wb")
    process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the FastAPI baseline exited with code {process.returncode}; see {log.name}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the FastAPI baseline was not ready after {ready_timeout_s:.0f} s; see {log.name}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/sentiment"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
