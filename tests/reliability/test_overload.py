"""Overload: four times the measured capacity of `translate` is refused fast, never queued without bound; a burst
past the queue bound of each dynamically batched endpoint is refused at once.

The front models' configs cap the queue (`default_queue_policy`: max_queue_size, REJECT after a timeout). This
test measures the endpoint's capacity with a closed loop, then offers 4× that rate open-loop (requests sent on a
clock, whatever the answers) and checks that rejections come back at once as UNAVAILABLE, the
accepted requests keep a bounded latency, the server's memory stays bounded, Triton's metrics count the
rejections it can count, and the server serves normally afterwards. Numbers go to the test log (-s).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter

import pytest
import tritonclient.grpc.aio as grpc_aio
from prometheus_text import metric_values, scrape
from reliability_helpers import OUTPUT, connect, infer, text_input
from tritonclient.utils import InferenceServerException

from serving.frontends.engine_front import QUEUE_FULL as ENGINE_FULL
from serving.launcher.processes import group_rss_mb

MODEL = "translate"
TEXTS = ["我们明天去北京。", "这本书很有意思。", "他每天早上六点起床，然后去公园跑步。", "我爱你。"]
QUEUE_FULL = "Exceeds maximum queue size"
TIMED_OUT = "Request timeout expired"


def queue_timeout_s(server) -> float:
    """How long the server lets a request of MODEL wait in its queue (the loaded config's queue policy)."""
    with connect(server, "grpc") as client:
        policy = client.get_model_config(MODEL).config.dynamic_batching.default_queue_policy
    return policy.default_timeout_microseconds / 1e6


async def _one(client, i: int, outcomes: list, model: str = MODEL, texts: list[str] = TEXTS) -> None:
    inputs = [text_input(grpc_aio, [texts[i % len(texts)]])]
    started = time.perf_counter()
    try:
        await client.infer(model, inputs, client_timeout=120)
        outcomes.append(("ok", time.perf_counter() - started))
    except InferenceServerException as err:
        outcomes.append((f"{err.status()}|{err.message()}", time.perf_counter() - started))


async def closed_loop_rate(url: str, concurrency: int, seconds: float) -> float:
    """Requests/s answered with `concurrency` clients each waiting for its answer: the capacity."""
    outcomes: list = []
    async with grpc_aio.InferenceServerClient(url) as client:
        end = time.perf_counter() + seconds

        async def worker(w: int) -> None:
            i = w
            while time.perf_counter() < end:
                await _one(client, i, outcomes)
                i += concurrency

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    assert all(kind == "ok" for kind, _ in outcomes), Counter(kind for kind, _ in outcomes)
    return len(outcomes) / seconds


async def open_loop(url: str, rate: float, seconds: float) -> list:
    """Send at `rate` per second for `seconds`, not waiting for answers; every outcome with its latency."""
    outcomes: list = []
    async with grpc_aio.InferenceServerClient(url) as client:
        tasks, start, i = [], time.perf_counter(), 0
        while (now := time.perf_counter()) - start < seconds:
            tasks.append(asyncio.create_task(_one(client, i, outcomes)))
            i += 1
            await asyncio.sleep(max(0.0, start + i / rate - now))
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)  # nothing hangs
    return outcomes


def p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def test_four_times_capacity_is_rejected_fast_and_bounded(start_server) -> None:
    server = start_server([MODEL, f"{MODEL}_generator"])
    timeout_s = queue_timeout_s(server)
    assert timeout_s > 0, "without a queue timeout, accepted requests could wait for ever"
    capacity = asyncio.run(closed_loop_rate(server.grpc_url, concurrency=16, seconds=3))
    memory_before = group_rss_mb(server.pid)
    outcomes = asyncio.run(open_loop(server.grpc_url, rate=4 * capacity, seconds=5))
    memory_after = group_rss_mb(server.pid)

    kinds = Counter(kind.split("|")[0] for kind, _ in outcomes)
    accepted = [latency for kind, latency in outcomes if kind == "ok"]
    # Triton's queue, or the generation engine's (its front model hands texts over at once, so the engine bounds
    # what waits: serving/frontends/engine_front.py)
    full = [latency for kind, latency in outcomes if QUEUE_FULL in kind or ENGINE_FULL in kind]
    timed_out = [latency for kind, latency in outcomes if TIMED_OUT in kind]
    print(
        f"\ncapacity {capacity:.0f} req/s; offered {4 * capacity:.0f} req/s for 5 s: {dict(kinds)}; "
        f"accepted p50 {p(accepted, 0.5):.3f} s p99 {p(accepted, 0.99):.3f} s; queue-full rejections "
        f"p50 {p(full, 0.5) * 1000:.1f} ms p99 {p(full, 0.99) * 1000:.1f} ms; timeouts {len(timed_out)}; "
        f"server RSS {memory_before:.0f} → {memory_after:.0f} MB"
    )
    # Every request answered or refused with UNAVAILABLE (gRPC) for a full queue or an expired wait; nothing else.
    assert set(kinds) <= {"ok", "StatusCode.UNAVAILABLE"}, kinds
    assert len(full) + len(timed_out) == kinds["StatusCode.UNAVAILABLE"]
    assert full, "no request was refused for a full queue: the queue is not bounded"
    assert len(accepted) > 0
    # Refusing is fast: a full queue answers at once, far sooner than an accepted request.
    assert statistics.median(full) < statistics.median(accepted)
    # Accepted requests waited at most the queue timeout, then ran: bounded, not growing with the backlog.
    assert p(accepted, 0.99) < timeout_s + 10
    # A bounded queue holds bounded memory.
    assert memory_after - memory_before < 300, (memory_before, memory_after)
    # Triton counts the requests it rejected from its queue (expired waits); a full queue is refused before the
    # request reaches the model, and Triton 2.51 does not count those (measured), so clients and the locust
    # report count them.
    rejected = metric_values(scrape(server.metrics_url), "nv_inference_request_failure", model=MODEL, reason="REJECTED")
    assert rejected, "no nv_inference_request_failure{reason=REJECTED} series: the count below would read 0"
    assert sum(rejected) == len(timed_out)
    # And afterwards it serves as before.
    with connect(server, "grpc") as client:
        assert infer(client, MODEL, [text_input(grpc_aio, ["我爱你。"])]).as_numpy("TRANSLATION").shape == (1, 1)


BURST_MODELS = {  # the endpoints that wait in Triton's dynamic batcher, with the models each loads
    "sentiment": ["sentiment", "sentiment_encoder"],
    "summarize": ["summarize", "summarize_generator", "summarize_extractor"],
}
LONG_TEXT = "这部电影的剧情很拖沓，但是演员的表演非常出色，配乐也很动人，总体来说值得一看。" * 6


async def burst(url: str, model: str, count: int) -> list:
    """`count` requests of one long text sent at once; each outcome ("ok" or "status|message") with its latency."""
    outcomes: list = []
    async with grpc_aio.InferenceServerClient(url) as client:
        requests = (_one(client, 0, outcomes, model, [LONG_TEXT]) for _ in range(count))
        await asyncio.wait_for(asyncio.gather(*requests), timeout=180)
    return outcomes


@pytest.mark.parametrize("model", sorted(BURST_MODELS))
def test_a_burst_past_the_queue_bound_is_refused_at_once(start_server, model: str) -> None:
    """A burst of four times the queue bound at a dynamically batched endpoint: the surplus is refused as a full
    queue at once, the rest answered; without `max_queue_size` every request would wait its turn."""
    server = start_server(BURST_MODELS[model])
    with connect(server, "grpc") as client:
        bound = client.get_model_config(model).config.dynamic_batching.default_queue_policy.max_queue_size
    assert bound > 0, f"{model} has no queue bound"
    outcomes = asyncio.run(burst(server.grpc_url, model, 4 * bound))
    kinds = Counter(kind.split("|")[0] for kind, _ in outcomes)
    full = [latency for kind, latency in outcomes if QUEUE_FULL in kind]
    accepted = [latency for kind, latency in outcomes if kind == "ok"]
    print(f"\n{model}: {4 * bound} at once, bound {bound}: {dict(kinds)}; {len(full)} refused as a full queue")
    assert len(outcomes) == 4 * bound  # every request got an answer or a refusal
    assert set(kinds) <= {"ok", "StatusCode.UNAVAILABLE"}, kinds
    assert full, "no request was refused for a full queue: the queue is not bounded"
    assert accepted and statistics.median(full) < statistics.median(accepted)  # refusing takes no waiting
    with connect(server, "grpc") as client:  # and it serves as before
        answer = infer(client, model, [text_input(grpc_aio, ["我爱你。"])]).as_numpy(OUTPUT[model])
    assert answer.shape[0] == 1
