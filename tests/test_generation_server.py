"""`translate` and `summarize` end to end on the real tritonserver over gRPC and HTTP."""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_text import settled_sums
from tritonclient.utils import InferenceServerException

from clients import Client, ClientError
from tasks import registry

ROOT = Path(__file__).resolve().parents[1]

SENTENCES = ["我爱你。", "他休息两天。", "我只有几支笔。", "今天天气很好。", "你叫什么名字？", "我们明天去北京。"]
NEWS = (
    "日前，方舟子发文直指林志颖旗下爱碧丽推销假保健品，引起哗然。调查发现，爱碧丽没有自己的生产加工厂。"
    "其胶原蛋白饮品无核心研发，全部代工生产。"
)


@pytest.fixture(params=["grpc", "http"])
def client(request, triton):
    url = triton.grpc_url if request.param == "grpc" else triton.http_address
    with Client(url, protocol=request.param) as c:
        yield c


def infer_raw(triton, protocol: str, model: str, inputs: dict[str, tuple[np.ndarray, str]]):
    module = grpcclient if protocol == "grpc" else httpclient
    c = module.InferenceServerClient(triton.grpc_url if protocol == "grpc" else triton.http_address)
    try:
        tensors = []
        for name, (data, datatype) in inputs.items():
            t = module.InferInput(name, list(data.shape), datatype)
            t.set_data_from_numpy(data)
            tensors.append(t)
        return c.infer(model, tensors)
    finally:
        c.close()


def texts(*items: bytes) -> tuple[np.ndarray, str]:
    return np.array(items, dtype=np.object_).reshape(-1, 1), "BYTES"


def test_i_love_you(client):
    (translation,) = client.translate(["我爱你。"])
    assert "love" in translation.lower(), translation
    for beams in (1, 4):
        assert "love" in client.translate(["我爱你。"], num_beams=beams)[0].lower()


def test_batch_of_32_mixed_lengths(client):
    batch = [SENTENCES[i % 6] * (1 + i % 4) for i in range(32)]
    out = client.translate(batch, num_beams=1)
    assert len(out) == 32 and all(isinstance(t, str) for t in out)
    assert sum(bool(t.strip()) for t in out) >= 30
    # rows do not leak into each other: a sentence alone gives the same output as inside the batch
    assert client.translate([batch[5]], num_beams=1)[0] == out[5]


def test_summary_is_short_chinese(client):
    (summary,) = client.summarize([NEWS])
    assert summary.strip() and len(summary) <= 80
    assert any("\u4e00" <= ch <= "\u9fff" for ch in summary)


def test_extractive_summaries_are_the_scorers_best_spans(client):
    """The default mode answers the span PyTorch's scorer ranks first (export/training/extractive.py), cut from the
    text."""
    from export.training import extractive

    model, config, tokenizer = extractive.load(ROOT / "checkpoints" / "summarize" / extractive.EXTRACTOR_FOLDER)
    articles = [NEWS, *registry()["summarize"].loadtest.texts]
    expected = extractive.pick(model, [extractive.make_example(t, tokenizer, config["max_tokens"]) for t in articles])
    assert client.summarize(articles) == expected
    assert client.summarize(articles, mode="extractive", num_beams=1) == expected  # the generator's options: unused
    assert all(summary and summary in text for summary, text in zip(expected, articles))
    assert client.summarize(articles, mode="abstractive", num_beams=1) != expected


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_unknown_mode_is_refused_with_the_choices(triton, protocol):
    with pytest.raises(InferenceServerException) as err:
        infer_raw(triton, protocol, "summarize", {"TEXT": texts(NEWS.encode()), "MODE": texts(b"poetic")})
    message = err.value.message()
    assert "MODE" in message and "poetic" in message and "extractive" in message and "abstractive" in message
    assert err.value.status() in ("StatusCode.INVALID_ARGUMENT", "400")


def test_max_new_tokens_bounds_the_output(client):
    short = client.translate(["我们明天去北京。"], max_new_tokens=2, num_beams=1)[0]
    assert len(short.split()) <= 2


def test_mixed_settings_in_one_batch_are_grouped(triton):
    """Concurrent requests with different NUM_BEAMS each get the answer they would get alone."""
    with Client(triton.grpc_url) as c:
        alone = {b: c.translate(SENTENCES, num_beams=b) for b in (1, 2, 4)}
        with cf.ThreadPoolExecutor(12) as pool:
            jobs = [(b, pool.submit(c.translate, SENTENCES, num_beams=b)) for b in (1, 2, 4) * 4]
            for beams, job in jobs:
                assert job.result() == alone[beams]


def test_concurrent_requests_are_merged(triton):
    names = ["nv_inference_count", "nv_inference_exec_count"]
    before = settled_sums(triton.metrics_url, names, model="translate")
    with Client(triton.grpc_url) as c, cf.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: c.translate([SENTENCES[i % 6]], num_beams=1), range(96)))
    after = settled_sums(triton.metrics_url, names, at_least=before[0] + 96, model="translate")
    count, execs = after[0] - before[0], after[1] - before[1]
    assert count == 96 and execs < count


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("model", ["translate", "summarize"])
@pytest.mark.parametrize(
    "inputs,expected",
    [
        ({"TEXT": texts(b"")}, "TEXT[0] is empty"),
        ({"TEXT": texts(b"\xff\xfe")}, "TEXT[0] is not valid UTF-8"),
        # out-of-range options: tests/reliability/test_bad_input_matrix.py checks both ends of each range
        (
            {"TEXT": texts("好".encode(), "坏".encode()), "NUM_BEAMS": (np.array([[1], [2]], np.int32), "INT32")},
            "NUM_BEAMS must be the same",
        ),
        ({"TEXT": texts("好".encode()), "NUM_BEAMS": (np.array([[1.0]], np.float32), "FP32")}, "NUM_BEAMS"),
    ],
)
def test_bad_input_names_the_field(triton, protocol, model, inputs, expected):
    with pytest.raises(InferenceServerException) as err:
        infer_raw(triton, protocol, model, inputs)
    assert expected in err.value.message()
    assert err.value.status() in ("StatusCode.INVALID_ARGUMENT", "400")


def test_server_keeps_serving_after_bad_input(client):
    with pytest.raises(ClientError, match="NUM_BEAMS must be between 1 and 8, got 99") as refused:
        client.translate(["好"], num_beams=99)
    assert refused.value.status in ("StatusCode.INVALID_ARGUMENT", "400")
    assert client.translate(["我爱你。"], num_beams=1)[0]
