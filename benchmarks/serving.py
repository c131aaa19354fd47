"""Comparisons 3 and 4, serving end to end: Triton variants over gRPC, and the FastAPI + PyTorch baseline.

All servers run at once (each idle while another is measured), so every repetition can interleave them:
four Triton variants (dynamic batching on/off × 1 or 2 instances of both sentiment models) measured with the
real perf_analyzer and with the project's async client, and the FastAPI baseline with the same async driver.
The Triton overhead is the end-to-end p50 at concurrency 1 minus raw ORT on the same single-text batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import data, perf_analyzer
from benchmarks.load import drive_http_json, drive_triton, fastapi_server
from benchmarks.onnx_variants import session
from benchmarks.profiles import REPOSITORY, Profile
from benchmarks.stats import interleaved, percentile, summarize, summarize_runs
from benchmarks.variant_repository import SENTIMENT_MODELS, ServingVariant, build
from export.data import sentiment_splits
from serving.embedded import EmbeddedTriton, ServerOptions, free_ports
from serving.frontends.base import BatchTokenizer

SERVED = ServingVariant()  # the committed configs: "our endpoint" in the comparison with FastAPI
KNOBS = tuple(ServingVariant(batching, instances) for instances in (1, 2) for batching in (True, False))
# The committed front models bound their queue with a 1 s timeout; measured, that policy makes a lone front
# instance stall ~500 ms now and then, so the served config is also measured without it.
VARIANTS = (SERVED, ServingVariant(queue_policy=False), *KNOBS)
REFERENCE = SERVED.name
FASTAPI = "fastapi_pytorch"


def request_texts(profile: Profile) -> tuple[list[str], str]:
    """The traffic every server gets, and its source: real reviews from the sentiment test split, or without
    the sentiment data the load test's built-in reviews."""
    if not data.available(profile.data_dir, "sentiment"):
        return data.fallback_texts("sentiment"), data.BUILT_IN
    rows = sentiment_splits(profile.data_dir)[2]
    return [row.text for row in rows[: profile.serving_texts]], "sentiment test split"


def raw_ort_latency(texts: list[str], repetitions: int) -> dict[str, float]:
    """p50 of the served ONNX file in ORT for one text per call, tokenized as the front model does.

    ``ort_p50_ms`` times only ``session.run`` (what Triton adds is everything else); ``tokenize_ort_p50_ms``
    adds the tokenizer, which the front model runs inside Triton.
    """
    config = json.loads((REPOSITORY / "sentiment" / "1" / "config.json").read_text(encoding="utf-8"))
    encoder = BatchTokenizer.from_file(REPOSITORY / "sentiment" / "1" / "tokenizer.json", config["max_tokens"])
    sess = session(REPOSITORY / "sentiment_encoder" / "1" / "model.onnx")
    run_only, with_tokenizer = [], []
    for _ in range(max(1, repetitions)):
        for text in texts:
            start = time.perf_counter()
            batch = encoder.encode([text])
            tokenized = time.perf_counter()
            sess.run(["logits"], {"input_ids": batch.ids, "attention_mask": batch.mask})
            done = time.perf_counter()
            run_only.append(done - tokenized)
            with_tokenizer.append(done - start)
    return {
        "ort_p50_ms": percentile(run_only, 50) * 1e3,
        "tokenize_ort_p50_ms": percentile(with_tokenizer, 50) * 1e3,
        "calls": len(run_only),
    }


def start_servers(stack: contextlib.ExitStack, workdir: Path) -> dict[str, EmbeddedTriton]:
    servers = {}
    for variant in VARIANTS:
        http, grpc, metrics = free_ports(3)
        options = ServerOptions(
            model_repository=build(workdir / "repositories", variant),
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            models=list(SENTIMENT_MODELS),
        )
        servers[variant.name] = stack.enter_context(EmbeddedTriton(options))
    return servers


def _run(coroutine_fn: Callable[..., Awaitable[dict]], *args: Any) -> dict:
    return asyncio.run(coroutine_fn(*args))


def measure_point(
    servers: dict[str, EmbeddedTriton],
    fastapi_url: str,
    texts: list[str],
    input_data: Path,
    concurrency: int,
    profile: Profile,
) -> dict[str, Any]:
    """One concurrency: perf_analyzer on every Triton variant, then the async client on them and on FastAPI,
    each tool's runs interleaved across the servers."""
    pa_calls = {
        name: partial(perf_analyzer.run, server.grpc_url, "sentiment", concurrency, input_data, profile.window_ms)
        for name, server in servers.items()
    }
    pa_runs = interleaved(pa_calls, profile.repetitions, desc=f"perf_analyzer c{concurrency}")
    client_calls = {
        name: partial(_run, drive_triton, server.grpc_url, texts, concurrency, profile.client_seconds)
        for name, server in servers.items()
    }
    client_calls[FASTAPI] = partial(_run, drive_http_json, fastapi_url, texts, concurrency, profile.client_seconds)
    client_runs = interleaved(client_calls, profile.repetitions, desc=f"async client c{concurrency}")
    return {
        "concurrency": concurrency,
        "perf_analyzer": {name: summarize_runs(runs) for name, runs in pa_runs.items()},
        "async_client": {name: summarize_runs(runs) for name, runs in client_runs.items()},
    }


def measure(profile: Profile, workdir: Path) -> dict[str, Any]:
    texts, source = request_texts(profile)
    input_data = perf_analyzer.write_input_data(texts, workdir / "perf_analyzer_input.json")
    perf_analyzer.locate()  # fail before starting five servers, not after
    with contextlib.ExitStack() as stack:
        servers = start_servers(stack, workdir)
        fastapi_url = stack.enter_context(fastapi_server(free_ports(1)[0]))
        # Warm-up: first requests load tokenizers and ORT arenas; eager PyTorch runs its first calls of each
        # new shape 10-100× slower, and the texts pad to up to 16 shapes.
        warmup = max(0.5, profile.client_seconds)
        for server in servers.values():
            asyncio.run(drive_triton(server.grpc_url, texts, 2, warmup, warmup_s=0))
        asyncio.run(drive_http_json(fastapi_url, texts, 2, 2 * warmup, warmup_s=0))
        points = [
            measure_point(servers, fastapi_url, texts, input_data, concurrency, profile)
            for concurrency in profile.concurrencies
        ]
    raw = raw_ort_latency(texts, profile.repetitions)
    first = next(p for p in points if p["concurrency"] == min(profile.concurrencies))
    e2e_p50 = first["perf_analyzer"][REFERENCE]["p50_ms"]["median"]
    return {
        "variants": {v.name: {"dynamic_batching": v.batching, "instances": v.instances} for v in VARIANTS},
        "reference": REFERENCE,
        "texts": len(texts),
        "texts_source": source,
        "mean_characters": float(np.mean([len(t) for t in texts])),
        "points": points,
        "raw_ort": raw,
        "overhead_c1": {
            "concurrency": first["concurrency"],
            "e2e_p50_ms": e2e_p50,
            "ort_p50_ms": raw["ort_p50_ms"],
            "overhead_ms": e2e_p50 - raw["ort_p50_ms"],
            "overhead_vs_tokenize_ort_ms": e2e_p50 - raw["tokenize_ort_p50_ms"],
        },
        "summary_of_e2e_p50": summarize([e2e_p50]),
    }
