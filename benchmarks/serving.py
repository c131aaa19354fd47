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
import random
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import cpu_share as cpu_share_module
from benchmarks import data, perf_analyzer
from benchmarks.load import drive_http_json, drive_triton, fastapi_server
from benchmarks.onnx_variants import session
from benchmarks.profiles import REPOSITORY, Profile
from benchmarks.stats import interleaved, percentile, summarize, summarize_runs
from benchmarks.variant_repository import SENTIMENT_MODELS, ServingVariant, build
from export.training.data import sentiment_splits
from serving.frontends.base import BatchTokenizer, length_buckets
from serving.launcher.embedded import EmbeddedTriton, ServerOptions, free_ports

SERVED = ServingVariant()  # the committed configs: "our endpoint" in the comparison with FastAPI
KNOBS = tuple(ServingVariant(batching, instances) for instances in (1, 2) for batching in (True, False))
# The committed front models bound their queue with a 1 s timeout; measured, that policy makes a lone front
# instance stall ~500 ms now and then, so the served config is also measured without it.
BLS_ENCODER = ServingVariant(bls_encoder=True)  # the encoder behind a BLS call, as served before
VARIANTS = (SERVED, BLS_ENCODER, ServingVariant(queue_policy=False), *KNOBS)
RAW_BATCH = 32  # texts per raw ORT batch, the batch of the raw figure
REFERENCE = SERVED.name
FASTAPI = "fastapi_pytorch"


def request_texts(profile: Profile) -> tuple[list[str], str]:
    """The traffic every server gets, and its source: real reviews, a seeded sample of the sentiment test split
    (all its sets in their proportions), or without the sentiment data the load test's built-in reviews."""
    if not data.available(profile.data_dir, "sentiment"):
        return data.fallback_texts("sentiment"), data.BUILT_IN
    rows = sentiment_splits(profile.data_dir)[2]
    sample = random.Random(13).sample(rows, min(profile.serving_texts, len(rows)))
    return [row.text for row in sample], "sentiment test split, seeded sample"


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


def raw_ort_batches(texts: list[str], repetitions: int) -> dict[str, dict[str, float]]:
    """Texts/s of the served ONNX file in ORT alone on the served texts, in batches of RAW_BATCH (file order),
    tokenized and grouped by length as the front model does; 1 thread and all usable cores, interleaved."""
    config = json.loads((REPOSITORY / "sentiment" / "1" / "config.json").read_text(encoding="utf-8"))
    tokenizer = BatchTokenizer.from_file(REPOSITORY / "sentiment" / "1" / "tokenizer.json", config["max_tokens"])
    batches = [texts[i : i + RAW_BATCH] for i in range(0, len(texts), RAW_BATCH)]
    path = REPOSITORY / "sentiment_encoder" / "1" / "model.onnx"
    sessions = {"all_cores": session(path), "1thread": session(path, 1)}

    def one_pass(sess: Any) -> float:
        started = time.perf_counter()
        for texts_of_batch in batches:
            batch = tokenizer.encode(texts_of_batch)
            for rows in length_buckets(batch.lengths):
                part = batch.take(rows)
                sess.run(["logits"], {"input_ids": part.ids, "attention_mask": part.mask})
        return len(texts) / (time.perf_counter() - started)

    for sess in sessions.values():
        one_pass(sess)  # warm-up: ORT allocates per shape on first use
    runs = interleaved({name: partial(one_pass, sess) for name, sess in sessions.items()}, repetitions, "raw ORT")
    return {name: summarize(rates) for name, rates in runs.items()}


def cpu_share(servers: dict[str, EmbeddedTriton], input_data: Path, profile: Profile) -> dict[str, Any]:
    """At the top concurrency, perf_analyzer on the served config and on the BLS-encoder one, interleaved, with
    the cores each process kind used meanwhile: where the time of a served request goes."""
    concurrency = max(profile.concurrencies)
    calls = {
        name: partial(
            cpu_share_module.cores_during,
            partial(perf_analyzer.run, servers[name].grpc_url, "sentiment", concurrency, input_data, profile.window_ms),
        )
        for name in (REFERENCE, BLS_ENCODER.name)
    }
    runs = interleaved(calls, profile.repetitions, desc=f"cpu share c{concurrency}")
    out: dict[str, Any] = {"concurrency": concurrency}
    for name, results in runs.items():
        kinds = sorted({kind for _, cores in results for kind in cores})
        out[name] = {
            "throughput": summarize([result["throughput"] for result, _ in results]),
            "cores": {kind: summarize([cores.get(kind, 0.0) for _, cores in results]) for kind in kinds},
        }
    return out


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
    perf_analyzer.locate()  # fail before starting the servers, not after
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
        cpu = cpu_share(servers, input_data, profile)
    raw = raw_ort_latency(texts, profile.repetitions)
    first = next(p for p in points if p["concurrency"] == min(profile.concurrencies))
    e2e_p50 = first["perf_analyzer"][REFERENCE]["p50_ms"]["median"]
    return {
        "variants": {
            v.name: {"dynamic_batching": v.batching, "instances": v.instances, "bls_encoder": v.bls_encoder}
            for v in VARIANTS
        },
        "reference": REFERENCE,
        "texts": len(texts),
        "texts_source": source,
        "mean_characters": float(np.mean([len(t) for t in texts])),
        "points": points,
        "raw_ort": raw,
        "raw_ort_batches": raw_ort_batches(texts, profile.repetitions),
        "cpu_share": cpu,
        "overhead_c1": {
            "concurrency": first["concurrency"],
            "e2e_p50_ms": e2e_p50,
            "ort_p50_ms": raw["ort_p50_ms"],
            "overhead_ms": e2e_p50 - raw["ort_p50_ms"],
            "overhead_vs_tokenize_ort_ms": e2e_p50 - raw["tokenize_ort_p50_ms"],
        },
        "summary_of_e2e_p50": summarize([e2e_p50]),
    }
