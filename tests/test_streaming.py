"""The streaming twins (`translate_stream`, `summarize_stream`) against the real server: pieces that add up to
the endpoint's answer over gRPC and HTTP (SSE), bad input refused by name, cancellation that frees the engine's
rows, and the CLI's --stream."""

from __future__ import annotations

import concurrent.futures as cf
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_text import metric_sum

from clients import Client, ClientError

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["我们明天去北京看长城。", "他每天早上六点起床，然后去公园跑步。", "请把窗户关上。"]
# Decoded over ~40 steps: pieces the engine makes faster than the responses go out are sent together, so only a
# text this long is sure to arrive in several pieces.
LONG = "他每天早上六点起床，然后去公园跑步，跑完步以后回家吃早饭，再坐地铁去公司上班，晚上八点才回到家。"
ABSTRACTIVE = {"mode": "abstractive"}  # summarize's generator; its default mode answers whole
NEWS = "国家统计局今天发布数据，上半年国内生产总值同比增长百分之七，增速与一季度持平，消费对经济增长的贡献率继续提高。"


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("beams", [1, 4])
def test_pieces_add_up_to_the_answer(triton, protocol, beams):
    url = triton.grpc_url if protocol == "grpc" else triton.http_url
    with Client(url, protocol) as client:
        translations = [("translate", text, {}) for text in (*TEXTS, LONG)]
        for task, text, options in [*translations, ("summarize", NEWS, ABSTRACTIVE)]:
            pieces = list(client.stream(task, text, num_beams=beams, **options))
            assert "".join(pieces) == client.infer(task, text, num_beams=beams, **options)[0], (task, text)
            if beams == 1 and text == LONG:  # greedy streams token by token
                assert len(pieces) >= 3, pieces


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_bad_input_to_a_stream_is_refused_by_name(triton, protocol):
    url = triton.grpc_url if protocol == "grpc" else triton.http_url
    with Client(url, protocol) as client:
        with pytest.raises(ClientError, match="NUM_BEAMS must be between 1 and 8, got 9"):
            list(client.stream("translate", "我爱你。", num_beams=9))
        with pytest.raises(ClientError, match="empty, whitespace-only"):
            list(client.stream("summarize", "   "))
        with pytest.raises(ClientError, match="MAX_NEW_TOKENS must be between"):
            list(client.stream("translate", "我爱你。", max_new_tokens=0))
        assert "".join(client.stream("translate", "我爱你。")) == client.translate("我爱你。")[0]  # still serving


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_extractive_stream_is_the_answer_in_one_piece(triton, protocol):
    url = triton.grpc_url if protocol == "grpc" else triton.http_url
    with Client(url, protocol) as client:
        pieces = list(client.stream("summarize", NEWS, mode="extractive"))
        assert pieces == client.summarize(NEWS, mode="extractive") and pieces[0] in NEWS


def test_concurrent_extractive_streams_each_get_their_own_text_s_answer(triton):
    """Extractive requests that arrive together are answered in one scorer call and split back by request."""
    news = [NEWS, *(text * 2 for text in TEXTS), NEWS[::-1], "今天天气很好，我们去公园散步吧。晚上一起吃饭。"]
    with Client(triton.grpc_url) as client, cf.ThreadPoolExecutor(len(news)) as pool:
        expected = client.summarize(news, mode="extractive")
        for _ in range(3):
            answers = list(pool.map(lambda text: list(client.stream("summarize", text, mode="extractive")), news))
            assert answers == [[answer] for answer in expected]
    assert all(answer in text for answer, text in zip(expected, news, strict=True))


def running_rows(triton, model: str) -> float:
    return metric_sum(triton.metrics_url, "ropeserve_engine_running_rows", model=model)


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``condition`` every 50 ms until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stream_batch(triton, texts: list[str], cancel_after_first: bool, requests: int = 1, beams: int = 4) -> float:
    """Stream `requests` requests of many texts (up to 80 tokens each) on one stream through tritonclient; seconds
    to the last one's end, or, cancelling after the first response, to the moment the engine reports no running
    rows."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(triton.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    inputs = [grpcclient.InferInput(name, [len(texts), 1], kind) for name, kind in
              (("TEXT", "BYTES"), ("NUM_BEAMS", "INT32"), ("MAX_NEW_TOKENS", "INT32"), ("MODE", "BYTES"))]  # fmt: skip
    inputs[0].set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.full((len(texts), 1), beams, np.int32))
    inputs[2].set_data_from_numpy(np.full((len(texts), 1), 80, np.int32))
    inputs[3].set_data_from_numpy(np.full((len(texts), 1), b"abstractive", dtype=np.object_))
    started = time.monotonic()
    for _ in range(requests):
        client.async_stream_infer("summarize_stream", inputs, enable_empty_final_response=True)
    try:
        finals = 0
        while True:
            result, error = answers.get(timeout=60)
            assert error is None, error
            finals += result.get_response().parameters["triton_final_response"].bool_param
            if cancel_after_first or finals == requests:
                break
        if not cancel_after_first:
            return time.monotonic() - started
        # The gauge is published twice a second: wait until it shows these rows, or a stale 0 would pass for freed.
        assert wait_until(lambda: running_rows(triton, "summarize_stream") > 0, 5), "the rows never showed"
        client.stop_stream(cancel_requests=True)
        cancelled = time.monotonic()
        wait_until(lambda: running_rows(triton, "summarize_stream") == 0, 30)
        return time.monotonic() - cancelled
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def test_a_cancelled_stream_frees_its_rows(triton):
    """A client that cancels frees its rows within a few steps, long before the requests would have ended. The
    running-rows gauge shows the engine up to METRICS_PERIOD_S + FLUSH_PERIOD_S late (0.75 s), so the requests
    must take well over twice that for the comparison to tell a cancel from their end. Four requests of 64 long
    texts at 4 beams fill the engine's queue (1,024 rows) and take about 2.7 s here; two took 1.4 s, too close."""
    texts = [f"{NEWS}第{i}条。" * 4 for i in range(64)]
    full = stream_batch(triton, texts, cancel_after_first=False, requests=4)
    freed = stream_batch(triton, texts, cancel_after_first=True, requests=4)
    assert freed < full / 2, f"rows freed {freed:.2f} s after the cancel; the whole request takes {full:.2f} s"
    assert running_rows(triton, "summarize_stream") == 0


def test_cli_stream_prints_the_answer(triton):
    args = ["-m", "clients", "translate", TEXTS[0], "--stream", "--beams", "1", "--url", triton.grpc_url]
    run = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    with Client(triton.grpc_url) as client:
        assert run.stdout.strip() == client.translate(TEXTS[0], num_beams=1)[0]


def test_queued_pieces_go_out_one_response_per_request_first_pieces_first():
    """What queued up while the messenger thread was busy: each request's pieces joined in order, its final flag
    kept, a request's first response ahead of the others' later ones, and an error in place of the pieces."""
    from serving.frontends.engine_front import _coalesce

    a, b, c, d = object(), object(), object(), object()
    queued = [
        (a, ["Hel", ""], False, False, None, {}),
        (b, ["I"], False, True, None, {"COUNT": 1}),
        (a, ["lo", "x"], False, False, None, {}),
        (d, ["It"], False, False, None, {}),
        (c, ["We"], False, True, None, {}),
        (b, ["!"], True, False, None, {"COUNT": 2}),
        (a, ["!", "y"], True, False, None, {}),
        (d, [""], True, False, "generation failed: out of memory", {}),
    ]
    assert _coalesce(queued) == [
        (b, ["I!"], True, None, {"COUNT": 2}),  # the other outputs: the latest
        (c, ["We"], False, None, {}),
        (a, ["Hello!", "xy"], True, None, {}),
        (d, ["It"], True, "generation failed: out of memory", {}),
    ]


def test_a_failed_row_ends_its_request_once_with_the_error():
    """The engine reports a row's failure: the request gets one final error, its other rows are cancelled (they
    leave at the next step), and their later tokens send nothing more."""
    from serving.engine.job import Job
    from serving.frontends.engine_front import Reply
    from serving.frontends.sentences import Document

    class Front:  # what Reply reads of its front model; records what would be sent and cancelled
        streaming = True

        def __init__(self) -> None:
            self.sent: list[tuple] = []
            self.cancelled: list[Job] = []
            self.engine = self

        def queue_response(self, reply, pieces, final, error=None):
            self.sent.append((list(pieces), final, error))

        def cancel(self, jobs):
            self.cancelled += jobs

    front = Front()
    reply = Reply(front, sender=object(), documents=[Document((text,), ("", "")) for text in "ab"])
    reply.jobs += [Job([2], 4, 1, reply.callback(row)) for row in range(2)]
    reply.fail("generation failed: out of memory")
    reply.fail("generation failed: again")
    reply.callback(1)([5, 6], True)
    assert front.sent == [(["", ""], True, "generation failed: out of memory")]
    assert front.cancelled == reply.jobs
