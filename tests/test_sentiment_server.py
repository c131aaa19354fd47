"""`sentiment` end to end on the real tritonserver, over gRPC and HTTP, with the real tritonclient."""

from __future__ import annotations

import concurrent.futures as cf

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_text import settled_sums
from tritonclient.utils import InferenceServerException

from clients import Client, ClientError

POSITIVE = [
    "这部电影不差",
    "菜很好吃，送餐也快，下次还点这家",
    "房间干净整洁，服务热情周到，非常满意",
    "酒店位置很好，早餐也丰富，下次还住这里",
]
NEGATIVE = [
    "服务一点也不好",
    "太难吃了，再也不会点了",
    "房间又脏又吵，前台态度很差",
    "质量太差，用了两天就坏了，很失望",
]


@pytest.fixture(params=["grpc", "http"])
def client(request, triton):
    url = triton.grpc_url if request.param == "grpc" else triton.http_address
    with Client(url, protocol=request.param) as c:
        yield c


def raw_client(triton, protocol: str):
    if protocol == "grpc":
        return grpcclient, grpcclient.InferenceServerClient(triton.grpc_url)
    return httpclient, httpclient.InferenceServerClient(triton.http_address)


def send_raw(triton, protocol: str, data: np.ndarray, datatype: str = "BYTES", name: str = "TEXT"):
    module, c = raw_client(triton, protocol)
    try:
        inp = module.InferInput(name, list(data.shape), datatype)
        inp.set_data_from_numpy(data)
        return c.infer("sentiment", [inp])
    finally:
        c.close()


def test_clear_reviews_and_negations(client):
    results = client.sentiment(POSITIVE + NEGATIVE)
    labels = [r.label for r in results]
    assert labels == ["positive"] * len(POSITIVE) + ["negative"] * len(NEGATIVE), list(zip(POSITIVE + NEGATIVE, labels))
    assert all(0.5 <= r.score <= 1.0 for r in results)


def test_batch_of_64_mixed_lengths(client):
    texts = [(POSITIVE + NEGATIVE)[i % 8] * (1 + i % 7) for i in range(64)]
    results = client.sentiment(texts)
    assert len(results) == 64
    assert {r.label for r in results} <= {"positive", "negative"}
    # the same text answers the same way whatever else shares its batch
    assert (
        results[0] == client.sentiment([texts[0]])[0]
        or abs(results[0].score - client.sentiment([texts[0]])[0].score) < 1e-4
    )


def test_long_text_is_truncated_not_refused(client):
    (result,) = client.sentiment(["服务很好，" * 2000])
    assert result.label in ("positive", "negative")


def test_concurrent_requests_are_merged_into_batches(triton):
    names = ["nv_inference_count", "nv_inference_exec_count"]
    before = settled_sums(triton.metrics_url, names, model="sentiment")
    with Client(triton.grpc_url) as c, cf.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: c.sentiment([POSITIVE[i % 4]]), range(160)))
    after = settled_sums(triton.metrics_url, names, at_least=before[0] + 160, model="sentiment")
    inferences, executions = after[0] - before[0], after[1] - before[1]
    assert inferences == 160
    assert executions < inferences, f"{executions} executions for {inferences} inferences: nothing was batched"


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize(
    "payload,expected",
    [
        ([b""], "TEXT[0] is empty"),
        ([b"   \n\t "], "TEXT[0] is empty"),
        ([b"\x00\x01\x07"], "only control characters"),
        ([b"\xff\xfe\xfa"], "TEXT[0] is not valid UTF-8"),
        (["好评".encode(), b"\xc3\x28"], "TEXT[1] is not valid UTF-8"),
    ],
)
def test_bad_text_gets_a_clear_invalid_argument(triton, protocol, payload, expected):
    with pytest.raises(InferenceServerException) as err:
        send_raw(triton, protocol, np.array(payload, dtype=np.object_).reshape(-1, 1))
    assert expected in err.value.message()
    assert err.value.status() in ("StatusCode.INVALID_ARGUMENT", "400")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_wrong_datatype_and_shape_are_refused(triton, protocol):
    with pytest.raises(InferenceServerException) as err:
        send_raw(triton, protocol, np.array([[1], [2]], dtype=np.int32), datatype="INT32")
    assert "TEXT" in err.value.message() and "data-type" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        send_raw(triton, protocol, np.array([[b"a", b"b"]], dtype=np.object_))
    assert "TEXT" in err.value.message() and "shape" in err.value.message().lower()
    with pytest.raises(InferenceServerException) as err:
        send_raw(triton, protocol, np.array([[b"a"]], dtype=np.object_), name="WRONG_NAME")
    assert "WRONG_NAME" in err.value.message() or "TEXT" in err.value.message()


def test_bad_requests_do_not_spoil_their_batch(triton):
    """Good and bad requests sent together: each good one is answered, each bad one errors."""
    good = np.array([[POSITIVE[0].encode()]], dtype=np.object_)
    bad = np.array([[b"\xff"]], dtype=np.object_)
    c = grpcclient.InferenceServerClient(triton.grpc_url)
    results: dict[int, object] = {}

    def callback(i, result, error):
        results[i] = error if error is not None else result

    for i in range(24):
        inp = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        inp.set_data_from_numpy(bad if i % 3 == 0 else good)
        c.async_infer("sentiment", [inp], callback=lambda result, error, i=i: callback(i, result, error))
    deadline = 60
    import time

    t0 = time.monotonic()
    while len(results) < 24 and time.monotonic() - t0 < deadline:
        time.sleep(0.05)
    c.close()
    assert len(results) == 24, "some requests got no answer"
    for i, r in results.items():
        if i % 3 == 0:
            assert isinstance(r, InferenceServerException) and "not valid UTF-8" in r.message()
        else:
            assert not isinstance(r, InferenceServerException), r
            assert r.as_numpy("LABEL")[0, 0] == b"positive"


def test_server_still_serves_after_bad_input(client):
    with pytest.raises((ClientError, ValueError)):
        client.sentiment([""])
    assert client.sentiment(["这部电影不差"])[0].label == "positive"
