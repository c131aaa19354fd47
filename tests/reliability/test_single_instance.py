"""One front instance with a bounded queue: answers sent after `execute()` returns, so 500 ms stalls are rare.

Triton 2.51's dynamic batcher with a queue policy is not woken when the only instance frees; answers returned from
`execute()` reach clients before that, so their next requests wait out the batcher's 500 ms idle wait
(serving/frontends/base.py, `sends_after_execute`; docs/reliability.md, "the price of the queue bound").
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from reliability_helpers import connect, infer, outcome, text_input

from benchmarks import perf_analyzer
from benchmarks.queue_policy import repository
from serving.frontends.base import SEND_AFTER_EXECUTE, sends_after_execute
from serving.launcher.drain import drain_front_models

STALL_S = 0.5  # the batcher's idle wait in Triton 2.51 (dynamic_batch_scheduler.cc)


def config(count: int, **policy: object) -> dict:
    groups = [{"count": count, "kind": "KIND_CPU"}]
    return {"instance_group": groups, "dynamic_batching": {"default_queue_policy": policy}}


def test_only_a_single_instance_with_a_queue_bound_sends_after_execute() -> None:
    # protobuf's JSON writes 64-bit integers as strings, and may write unset fields as zeros
    assert sends_after_execute(config(1, max_queue_size=256, default_timeout_microseconds="1000000"))
    assert sends_after_execute(config(1, default_timeout_microseconds="1000000"))
    assert not sends_after_execute(config(2, max_queue_size=256))
    assert not sends_after_execute(config(1, max_queue_size=0, default_timeout_microseconds="0"))
    assert not sends_after_execute({"instance_group": [{"count": 1}]})
    # the parameter overrides the rule either way, and a value it does not know is refused by name
    setting = {SEND_AFTER_EXECUTE: {"string_value": "false"}}
    assert not sends_after_execute({**config(1, max_queue_size=256), "parameters": setting})
    setting = {SEND_AFTER_EXECUTE: {"string_value": "true"}}
    assert sends_after_execute({**config(2, max_queue_size=256), "parameters": setting})
    with pytest.raises(ValueError, match=SEND_AFTER_EXECUTE):
        sends_after_execute({**config(1), "parameters": {SEND_AFTER_EXECUTE: {"string_value": "yes"}}})


@pytest.mark.server
def test_one_instance_with_the_committed_queue_bound_does_not_stall(start_server, tmp_path: Path) -> None:
    # perf_analyzer (C++) sends the next request as soon as an answer arrives, which is what exposes the stall;
    # Python clients are too slow to: the instance is free again by the time their next request arrives.
    data = perf_analyzer.write_input_data(
        ["这部电影不差，演员也很用心。", "太难看了，浪费时间。"], tmp_path / "input.json"
    )
    measured = {}
    for variant in ("committed", "committed_returned"):  # sentiment as shipped but one front instance; answers
        repo = repository(tmp_path, variant, 1)  # sent after execute(), then returned from it (the safeguard off)
        server = start_server(["sentiment", "sentiment_encoder"], repository=repo)
        measured[variant] = perf_analyzer.run(server.grpc_url, "sentiment", 8, data, 1000)
        with connect(server, "http") as client:  # the other protocol is answered the same way
            label = infer(client, "sentiment", [text_input(httpclient, ["这部电影很好看"])]).as_numpy("LABEL")[0, 0]
        assert label.decode() in {"positive", "negative"}
        server.stop()
    print(
        "\none instance, 8 perf_analyzer clients: "
        + "; ".join(f"{v}: {r['throughput']:.0f} infer/s, p99 {r['p99_ms']:.1f} ms" for v, r in measured.items())
    )
    # Each stall holds every client for the batcher's idle wait; sent after execute(), stalls are rare (a run may
    # still see one: docs/reliability.md), returned they come every few batches: 2.8x or more apart when measured.
    assert measured["committed_returned"]["p99_ms"] > STALL_S * 1000 * 0.9  # the stall this guards against
    assert measured["committed"]["throughput"] > 2 * measured["committed_returned"]["throughput"]


@pytest.mark.server
def test_one_instance_drained_under_load_answers_what_it_held(start_server, tmp_path: Path) -> None:
    """Answers sent from the front's thread are not lost when the model unloads: Triton waits for each request's
    final answer before it finalizes the model."""
    server = start_server(["sentiment", "sentiment_encoder"], repository=repository(tmp_path, "committed", 1))
    review = "这部电影的剧情很拖沓，但是演员的表演非常出色，配乐也很动人，总体来说值得一看。" * 12
    results: list[str] = []

    def requests() -> None:  # 16 long reviews a request: each keeps the instance busy for a while
        with connect(server, "grpc") as client:
            for _ in range(6):
                results.append(outcome(client, "sentiment", [text_input(grpcclient, [review] * 16)], timeout_s=30))

    threads = [threading.Thread(target=requests) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    drained = drain_front_models(server.http_url, server.control_headers("http"), timeout_s=30)
    for thread in threads:
        thread.join(timeout=60)
    print(f"\ndrained {drained} under load: {Counter(r.split(':')[0] for r in results)}")
    assert drained == ["sentiment"]
    # every request was answered, or refused by name once the front was gone; none waited out its deadline
    assert all(r == "ok" or ("NOT_FOUND" in r and "sentiment" in r) for r in results), Counter(results)
    assert results.count("ok") >= 4
