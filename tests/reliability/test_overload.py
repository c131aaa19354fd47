"""Overload: four times the measured capacity of `translate` is refused fast, never queued without bound; a
batching front model refuses what would wait past its queue's bound.

`translate`'s front model hands texts to the generation engine at once, and the engine refuses a text that would
queue behind too many rows (serving/frontends/continuous.py). The batching front models (`sentiment`,
`summarize`, the explain twins) bound their own queue (serving/frontends/waiting.py). The first test measures
`translate`'s capacity with a closed loop, then offers 4× that rate open-loop (requests sent on a clock, whatever
the answers) and checks that rejections come back at once as UNAVAILABLE, the accepted requests keep a bounded
latency, the server's memory stays bounded, the front model's metric counts the rejections, and the server
serves normally afterwards. Numbers go to the test log (-s).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter

import tritonclient.grpc.aio as grpc_aio
from reliability_helpers import connect, infer, text_input
from tritonclient.utils import InferenceServerException

from serving.frontends.continuous import MAX_QUEUED_ROWS
from serving.frontends.continuous import QUEUE_FULL as ENGINE_FULL
from serving.metrics import settled_sums
from serving.processes import group_rss_mb
from tasks import registry

MODEL = "translate"
TEXTS = ["我们明天去北京。", "这本书很有意思。", "他每天早上六点起床，然后去公园跑步。", "我爱你。"]
ARTICLE = (
    "注意力机制让模型在生成每个词时回看输入的每个位置，并按相关程度加权。旋转位置编码把位置信息写进查询和键的旋转角度里，"
    "使注意力分数只依赖两个词之间的相对距离。这样训练出的模型能处理比训练时更长的文本，也便于在推理时缓存键和值。"
)


def rejected_total(server, model: str, at_least: int) -> float:
    """The front model's count of requests it refused as overloaded, once the count settles."""
    names = ["ropeserve_rejected_requests_total"]
    return settled_sums(server.metrics_url, names, at_least, model=model, reason="overloaded")[0]


async def _one(client, i: int, outcomes: list, model: str = MODEL, texts: list[str] = TEXTS) -> None:
    inputs = [text_input(grpc_aio, [texts[i % len(texts)]])]
    started = time.perf_counter()
    try:
        await client.infer(model, inputs, client_timeout=60)
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
    capacity = asyncio.run(closed_loop_rate(server.grpc_url, concurrency=16, seconds=3))
    memory_before = group_rss_mb(server.pid)
    outcomes = asyncio.run(open_loop(server.grpc_url, rate=4 * capacity, seconds=5))
    memory_after = group_rss_mb(server.pid)

    kinds = Counter(kind.split("|")[0] for kind, _ in outcomes)
    accepted = [latency for kind, latency in outcomes if kind == "ok"]
    full = [latency for kind, latency in outcomes if ENGINE_FULL in kind]
    print(
        f"\ncapacity {capacity:.0f} req/s; offered {4 * capacity:.0f} req/s for 5 s: {dict(kinds)}; "
        f"accepted p50 {p(accepted, 0.5):.3f} s p99 {p(accepted, 0.99):.3f} s; queue-full rejections "
        f"p50 {p(full, 0.5) * 1000:.1f} ms p99 {p(full, 0.99) * 1000:.1f} ms; "
        f"server RSS {memory_before:.0f} → {memory_after:.0f} MB"
    )
    # Every request answered or refused with UNAVAILABLE (gRPC) for a full engine queue; nothing else.
    assert set(kinds) <= {"ok", "StatusCode.UNAVAILABLE"}, kinds
    assert len(full) == kinds["StatusCode.UNAVAILABLE"]
    assert full, "no request was refused for a full queue: the queue is not bounded"
    assert len(accepted) > 0
    # Refusing is fast: a full queue answers at once, far sooner than an accepted request.
    assert statistics.median(full) < statistics.median(accepted)
    # Accepted requests waited at most for the rows ahead of them: each instance's engine holds at most
    # MAX_QUEUED_ROWS rows, a request here is one sentence x the default beams, served at the measured capacity.
    beams = next(o.default for o in registry(())[MODEL].options if o.keyword == "num_beams")
    queue_s = 2 * MAX_QUEUED_ROWS / beams / capacity
    assert p(accepted, 0.99) < 2 * queue_s + 5, (p(accepted, 0.99), queue_s)
    # A bounded queue holds bounded memory.
    assert memory_after - memory_before < 300, (memory_before, memory_after)
    # The front model counts what it refused.
    assert rejected_total(server, MODEL, at_least=len(full)) == len(full)
    # And afterwards it serves as before.
    with connect(server, "grpc") as client:
        assert infer(client, MODEL, [text_input(grpc_aio, ["我爱你。"])]).as_numpy("TRANSLATION").shape == (1, 1)


async def burst(url: str, model: str, requests: int) -> list:
    """``requests`` requests sent at once; every outcome with its latency."""
    outcomes: list = []
    async with grpc_aio.InferenceServerClient(url) as client:
        await asyncio.wait_for(
            asyncio.gather(*(_one(client, i, outcomes, model, [ARTICLE]) for i in range(requests))), timeout=120
        )
    return outcomes


def test_a_batching_front_refuses_what_would_wait_past_its_queue(start_server) -> None:
    """`summarize` (abstractive, a batching front model) gets a burst of four times what its queue holds: the
    requests that find the queue full are refused at once with UNAVAILABLE, the others are answered, and the
    front model counts the refusals. Without the bound every request would wait its turn."""
    server = start_server(["summarize", "summarize_generator", "summarize_extractor"])
    endpoint = registry(())["summarize"].endpoint
    outcomes = asyncio.run(burst(server.grpc_url, "summarize", 4 * endpoint.queue_size))
    kinds = Counter(kind.split("|")[0] for kind, _ in outcomes)
    accepted = [latency for kind, latency in outcomes if kind == "ok"]
    full = [latency for kind, latency in outcomes if "requests are waiting" in kind]
    late = [latency for kind, latency in outcomes if "the request waited over" in kind]
    print(f"\n{len(outcomes)} at once: {dict(kinds)}; {len(full)} refused for a full queue, {len(late)} for waiting")
    assert set(kinds) <= {"ok", "StatusCode.UNAVAILABLE"}, kinds
    assert len(full) + len(late) == kinds["StatusCode.UNAVAILABLE"]
    assert full, "no request was refused for a full queue: the front model's queue is not bounded"
    assert accepted and statistics.median(full) < statistics.median(accepted)
    assert rejected_total(server, "summarize", at_least=len(full)) == len(full)
