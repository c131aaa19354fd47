"""Unit tests of the client SDK and CLI that need no Triton server.

Request building and response decoding run against tritonclient's real InferInput/InferResult classes (so a
dtype or shape the wire format would refuse fails here), the retry loop against a recorded clock, and the CLI
against an in-memory stand-in for `Client`. One test talks to a real, closed port to check the
"cannot reach Triton" path end to end. Tests against a running server live elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import random
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from clients import (
    AsyncClient,
    Client,
    ClientError,
    RetryPolicy,
    Sentiment,
    ServerUnreachable,
    Status,
    cli,
)
from clients.endpoints import (
    Endpoint,
    build_inputs,
    endpoint,
    endpoints,
    int_option_tensor,
    normalize_texts,
    string_option_tensor,
    text_tensor,
)
from clients.errors import (
    BAD_RESPONSE,
    DEADLINE_EXCEEDED,
    UNREACHABLE,
    to_client_error,
    translated_errors,
)
from clients.retry import call_with_retry, call_with_retry_async
from clients.streaming import _inputs as stream_inputs
from clients.transport import TRANSPORTS, normalize_url, transport_for
from tasks.definition import Option

REPO_ROOT = Path(__file__).resolve().parents[1]
SENTIMENT, TRANSLATE, SUMMARIZE = endpoint("sentiment"), endpoint("translate"), endpoint("summarize")
TEXTS = ["这部电影不差", "我爱你。", "😀 emoji and ascii"]
NO_WAIT = RetryPolicy(max_attempts=3, base_delay_s=0.0, max_delay_s=0.0)
# An endpoint with an int and a string option, as a definition declares them (built from translate's, which
# has only ints, so these tests do not follow the built-in tasks' options).
MODE = Option("mode", "MODE", "abstractive", "how to summarize", ("--mode",), choices=("abstractive", "extractive"))
MODED = Endpoint(
    "moded", TRANSLATE.outputs, TRANSLATE.decode, {"num_beams": TRANSLATE.options["num_beams"], "mode": MODE}
)


# --- helpers -----------------------------------------------------


class DictResult:
    """Stands in for an InferResult: as_numpy over a dict."""

    def __init__(self, outputs: dict[str, np.ndarray]) -> None:
        self.outputs = outputs

    def as_numpy(self, name: str) -> np.ndarray | None:
        return self.outputs.get(name)


class RecordingInput:
    """An InferInput factory that keeps what was set, to check the arrays themselves."""

    def __init__(self, name: str, shape: list[int], datatype: str) -> None:
        self.name, self.shape, self.datatype = name, shape, datatype
        self.data: np.ndarray | None = None

    def set_data_from_numpy(self, array: np.ndarray) -> None:
        self.data = array


def grpc_result(outputs: dict[str, np.ndarray]) -> triton_grpc.InferResult:
    """A real gRPC InferResult, serialized the way Triton sends it (raw BYTES/FP32 contents)."""
    response = service_pb2.ModelInferResponse(model_name="test")
    for name, array in outputs.items():
        tensor = response.outputs.add(name=name, datatype="BYTES" if array.dtype == np.object_ else "FP32")
        tensor.shape.extend(array.shape)
        raw = serialize_byte_tensor(array).item() if array.dtype == np.object_ else array.tobytes()
        response.raw_output_contents.append(raw)
    return triton_grpc.InferResult(response)


def http_json_result(outputs: dict[str, tuple[str, list[Any]]]) -> triton_http.InferResult:
    """A real HTTP InferResult from a JSON (non-binary) body, where BYTES come back as str."""
    body = {
        "model_name": "test",
        "outputs": [
            {"name": name, "datatype": datatype, "shape": [len(data), 1], "data": data}
            for name, (datatype, data) in outputs.items()
        ],
    }
    return triton_http.InferResult.from_response_body(json.dumps(body).encode())


def bytes_column(values: Sequence[str]) -> np.ndarray:
    return np.array([[value.encode()] for value in values], dtype=np.object_)


def unused_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def triton_error(status: str, message: str) -> InferenceServerException:
    return InferenceServerException(msg=message, status=status)


# --- input building ----------------------------------------------


def test_lone_string_is_a_batch_of_one() -> None:
    assert normalize_texts("我爱你") == ["我爱你"]
    assert normalize_texts(("a", "b")) == ["a", "b"]


@pytest.mark.parametrize(
    ("texts", "error"),
    [([], ValueError), (["ok", 3], TypeError), (b"bytes", TypeError), (None, TypeError), ([b"x"], TypeError)],
)
def test_bad_texts_fail_before_sending(texts: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        normalize_texts(texts)


def test_text_tensor_is_n_by_1_utf8_bytes() -> None:
    tensor = text_tensor(TEXTS)
    assert tensor.shape == (3, 1)
    assert tensor.dtype == np.object_
    assert [row[0] for row in tensor] == [text.encode("utf-8") for text in TEXTS]


def test_text_tensor_keeps_empty_and_single_texts_two_dimensional() -> None:
    assert text_tensor([""]).shape == (1, 1)
    assert text_tensor([""])[0, 0] == b""


def test_generation_options_become_int32_columns_repeating_the_value() -> None:
    inputs = build_inputs(TRANSLATE, TEXTS, {"max_new_tokens": 32, "num_beams": 4}, RecordingInput)
    by_name = {tensor.name: tensor for tensor in inputs}
    assert list(by_name) == ["TEXT", "MAX_NEW_TOKENS", "NUM_BEAMS"]
    assert by_name["TEXT"].datatype == "BYTES" and by_name["TEXT"].shape == [3, 1]
    for name, value in (("MAX_NEW_TOKENS", 32), ("NUM_BEAMS", 4)):
        tensor = by_name[name]
        assert (tensor.datatype, tensor.shape) == ("INT32", [3, 1])
        assert tensor.data is not None and tensor.data.dtype == np.int32
        assert tensor.data.tolist() == [[value]] * 3


def test_options_left_as_none_are_not_sent_so_server_defaults_apply() -> None:
    inputs = build_inputs(SUMMARIZE, TEXTS, {"max_new_tokens": None, "num_beams": 2}, RecordingInput)
    assert [tensor.name for tensor in inputs] == ["TEXT", "NUM_BEAMS"]
    assert [tensor.name for tensor in build_inputs(SENTIMENT, TEXTS, {}, RecordingInput)] == ["TEXT"]


@pytest.mark.parametrize("infer_input", [triton_grpc.InferInput, triton_http.InferInput])
def test_real_infer_inputs_accept_our_arrays(infer_input: Any) -> None:
    # tritonclient checks that the array's dtype and shape match the declared datatype and shape.
    inputs = build_inputs(TRANSLATE, TEXTS, {"max_new_tokens": 16, "num_beams": 1}, infer_input)
    assert [(i.name(), i.datatype(), i.shape()) for i in inputs] == [
        ("TEXT", "BYTES", [3, 1]),
        ("MAX_NEW_TOKENS", "INT32", [3, 1]),
        ("NUM_BEAMS", "INT32", [3, 1]),
    ]


def test_an_option_the_endpoint_does_not_take_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="num_beams"):
        build_inputs(SENTIMENT, TEXTS, {"num_beams": 4}, RecordingInput)


@pytest.mark.parametrize(
    ("value", "error"), [(True, TypeError), (4.0, TypeError), ("4", TypeError), (2**31, ValueError)]
)
def test_option_values_must_be_int32(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        int_option_tensor("num_beams", value, 2)


def test_option_range_is_left_to_the_server() -> None:
    assert int_option_tensor("num_beams", 99, 1).tolist() == [[99]]
    assert int_option_tensor("num_beams", np.int64(3), 1).tolist() == [[3]]


def test_a_string_option_becomes_a_bytes_column_repeating_the_utf8_value() -> None:
    inputs = build_inputs(MODED, TEXTS, {"mode": "extractive", "num_beams": 2}, RecordingInput)
    by_name = {tensor.name: tensor for tensor in inputs}
    assert list(by_name) == ["TEXT", "MODE", "NUM_BEAMS"]
    assert (by_name["MODE"].datatype, by_name["MODE"].shape) == ("BYTES", [3, 1])
    assert by_name["MODE"].data is not None and by_name["MODE"].data.dtype == np.object_
    assert by_name["MODE"].data.tolist() == [[b"extractive"]] * 3
    assert by_name["NUM_BEAMS"].datatype == "INT32"
    # the streaming twin's request carries it the same way
    assert stream_inputs("长文", {"mode": "extractive"}, {"mode": MODE})["MODE"].tolist() == [[b"extractive"]]


@pytest.mark.parametrize("infer_input", [triton_grpc.InferInput, triton_http.InferInput])
def test_real_infer_inputs_accept_a_string_option(infer_input: Any) -> None:
    inputs = build_inputs(MODED, TEXTS[:1], {"mode": "abstractive"}, infer_input)
    assert [(i.name(), i.datatype(), i.shape()) for i in inputs] == [
        ("TEXT", "BYTES", [1, 1]),
        ("MODE", "BYTES", [1, 1]),
    ]


@pytest.mark.parametrize("value", [1, b"extractive", ["extractive"]])
def test_a_string_option_value_must_be_a_str(value: Any) -> None:
    with pytest.raises(TypeError, match="mode must be a str"):
        build_inputs(MODED, TEXTS, {"mode": value}, RecordingInput)


def test_choices_are_left_to_the_server_like_ranges() -> None:
    assert string_option_tensor("mode", "poetry", 2).tolist() == [[b"poetry"], [b"poetry"]]


def test_every_endpoint_sends_what_the_served_config_takes_and_asks_for_what_it_returns() -> None:
    """The SDK's requests fit the committed Triton config of each endpoint (read as Triton reads it)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    for name, e in endpoints().items():
        config = text_format.Parse(
            (REPO_ROOT / "model_repository" / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
        )
        optional = {i.name for i in config.input if i.optional}
        required = {i.name for i in config.input if not i.optional}
        assert required == {"TEXT"} and {o.input for o in e.options.values()} == optional, name
        assert set(e.outputs) == {o.name for o in config.output}, name


# --- output decoding ---------------------------------------------


def test_sentiment_decodes_from_a_grpc_response() -> None:
    result = grpc_result(
        {
            "LABEL": bytes_column(["positive", "negative"]),
            "SCORE": np.array([[0.91], [0.75]], dtype=np.float32),
        }
    )
    decoded = SENTIMENT.decode(result, 2)
    assert [s.label for s in decoded] == ["positive", "negative"]
    assert [s.score for s in decoded] == pytest.approx([0.91, 0.75])
    assert all(isinstance(s.score, float) for s in decoded)


def test_generated_text_decodes_utf8_from_grpc_and_str_from_http_json() -> None:
    assert TRANSLATE.decode(grpc_result({"TRANSLATION": bytes_column(["I love you.", "é"])}), 2) == [
        "I love you.",
        "é",
    ]
    assert SUMMARIZE.decode(http_json_result({"SUMMARY": ("BYTES", ["标题", "二"])}), 2) == ["标题", "二"]


def test_a_missing_output_is_a_bad_response() -> None:
    with pytest.raises(ClientError) as caught:
        SENTIMENT.decode(DictResult({"LABEL": bytes_column(["positive"])}), 1)
    assert caught.value.status == BAD_RESPONSE and "SCORE" in caught.value.message


def test_a_row_count_mismatch_is_a_bad_response() -> None:
    with pytest.raises(ClientError, match="1 rows for 2 texts"):
        TRANSLATE.decode(DictResult({"TRANSLATION": bytes_column(["only one"])}), 2)


# --- retries -----------------------------------------------------


def test_backoff_caps_grow_exponentially_up_to_the_maximum() -> None:
    policy = RetryPolicy(max_attempts=10, base_delay_s=0.1, max_delay_s=1.0, jitter=False)
    assert [policy.delay(k) for k in range(1, 7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert policy.delay_cap(10_000) == 1.0  # no overflow far out


def test_full_jitter_draws_uniformly_below_the_cap() -> None:
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=1.0)
    rng = random.Random(7)
    for retry_number in range(1, 8):
        draws = [policy.delay(retry_number, rng) for _ in range(200)]
        cap = policy.delay_cap(retry_number)
        assert all(0.0 <= d <= cap for d in draws)
        assert min(draws) < 0.25 * cap and max(draws) > 0.75 * cap  # spread over the whole range
    assert policy.delay(3, random.Random(1)) == policy.delay(3, random.Random(1))


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (ClientError("queue full", "StatusCode.UNAVAILABLE"), True),
        (ClientError("overloaded", "503"), True),
        (ClientError("rate limited", "429"), True),
        (ServerUnreachable("refused", UNREACHABLE), True),
        (ClientError("bad text", "StatusCode.INVALID_ARGUMENT"), False),
        (ClientError("bad text", "400"), False),
        (ClientError("slow", "StatusCode.DEADLINE_EXCEEDED"), False),
        (ClientError("slow", DEADLINE_EXCEEDED), False),
        (ClientError("broken", BAD_RESPONSE), False),
        (ClientError("server bug", "500"), False),
        (ClientError("Request for unknown model: 'sentiment' has no available versions", "StatusCode.NOT_FOUND"), True),
        (ClientError("Request for unknown model: 'sentiment' is not found", "StatusCode.NOT_FOUND"), False),
    ],
)
def test_only_overload_and_unreachable_are_retried(error: ClientError, retryable: bool) -> None:
    assert RetryPolicy().is_retryable(error) is retryable


def test_retry_decision_respects_attempts_and_switches() -> None:
    overloaded = ClientError("queue full", "503")
    policy = RetryPolicy(max_attempts=3, jitter=False)
    assert policy.next_delay(overloaded, 1) == pytest.approx(0.1)
    assert policy.next_delay(overloaded, 2) == pytest.approx(0.2)
    assert policy.next_delay(overloaded, 3) is None
    assert RetryPolicy.disabled().next_delay(overloaded, 1) is None
    assert RetryPolicy(retry_unreachable=False).next_delay(ServerUnreachable("refused"), 1) is None
    assert RetryPolicy(retry_codes=frozenset({Status.INTERNAL})).is_retryable(ClientError("x", "500"))
    assert RetryPolicy(retry_codes=frozenset({Status.INTERNAL})).is_retryable(ClientError("x", "StatusCode.INTERNAL"))


@pytest.mark.parametrize(
    ("grpc", "http", "code"),
    [
        ("StatusCode.INVALID_ARGUMENT", "400", Status.INVALID_ARGUMENT),
        ("StatusCode.NOT_FOUND", "404", Status.NOT_FOUND),
        ("StatusCode.UNAVAILABLE", "503", Status.UNAVAILABLE),
        ("StatusCode.RESOURCE_EXHAUSTED", "429", Status.RESOURCE_EXHAUSTED),
        ("StatusCode.INTERNAL", "500", Status.INTERNAL),
        ("StatusCode.DEADLINE_EXCEEDED", "504", Status.DEADLINE_EXCEEDED),
        ("StatusCode.PERMISSION_DENIED", "418", Status.UNKNOWN),
    ],
)
def test_one_status_code_whichever_transport_failed(grpc: str, http: str, code: Status) -> None:
    assert ClientError("x", grpc).code is ClientError("x", http).code is code


def test_our_own_failures_have_codes_of_their_own() -> None:
    assert ServerUnreachable("refused", UNREACHABLE).code is Status.UNREACHABLE
    assert ClientError("slow", DEADLINE_EXCEEDED).code is Status.DEADLINE_EXCEEDED
    assert ClientError("broken", BAD_RESPONSE).code is Status.BAD_RESPONSE
    assert ClientError("no status").code is Status.UNKNOWN


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"base_delay_s": -1.0}, {"max_delay_s": -0.5}], ids=str)
def test_nonsense_policies_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


class Flaky:
    """Fails with the given errors, then returns "ok"; counts calls."""

    def __init__(self, *errors: ClientError) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_retry_loop_sleeps_the_schedule_then_succeeds() -> None:
    slept: list[float] = []
    flaky = Flaky(ClientError("full", "StatusCode.UNAVAILABLE"), ServerUnreachable("down"))
    policy = RetryPolicy(max_attempts=3, base_delay_s=0.5, jitter=False)
    assert call_with_retry(flaky, policy, sleep=slept.append) == "ok"
    assert flaky.calls == 3 and slept == [0.5, 1.0]


def test_retry_loop_gives_up_after_max_attempts_with_the_last_error() -> None:
    slept: list[float] = []
    last = ClientError("still full", "503")
    flaky = Flaky(ClientError("full", "503"), ClientError("full", "503"), last)
    with pytest.raises(ClientError) as caught:
        call_with_retry(flaky, RetryPolicy(max_attempts=3), sleep=slept.append)
    assert caught.value is last and flaky.calls == 3 and len(slept) == 2


def test_retry_loop_raises_a_client_mistake_at_once() -> None:
    slept: list[float] = []
    flaky = Flaky(ClientError("bad", "StatusCode.INVALID_ARGUMENT"))
    with pytest.raises(ClientError, match="bad"):
        call_with_retry(flaky, RetryPolicy(max_attempts=5), sleep=slept.append)
    assert flaky.calls == 1 and slept == []


def test_async_retry_loop_makes_the_same_decisions() -> None:
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    flaky = Flaky(ClientError("full", "429"))

    async def attempt() -> str:
        return flaky()

    policy = RetryPolicy(max_attempts=2, base_delay_s=0.25, jitter=False)
    assert asyncio.run(call_with_retry_async(attempt, policy, sleep=fake_sleep)) == "ok"
    assert slept == [0.25] and flaky.calls == 2


# --- errors ------------------------------------------------------


def test_grpc_connection_failure_is_unreachable_but_a_full_queue_is_not() -> None:
    refused = triton_error(
        "StatusCode.UNAVAILABLE",
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused",
    )
    full = triton_error("StatusCode.UNAVAILABLE", "Exceeds maximum queue size")
    assert isinstance(to_client_error(refused, "h:1", 1.0), ServerUnreachable)
    full_error = to_client_error(full, "h:1", 1.0)
    assert type(full_error) is ClientError and full_error.status == "StatusCode.UNAVAILABLE"
    assert RetryPolicy().is_retryable(full_error)


def test_http_errors_keep_status_and_server_message() -> None:
    error = to_client_error(triton_error("400", "TEXT is empty"), "h:8000", 1.0)
    assert error is not None
    assert (error.status, error.message, error.url, str(error)) == (
        "400",
        "TEXT is empty",
        "h:8000",
        "[400] TEXT is empty",
    )


def test_a_connection_the_server_closed_before_answering_is_unreachable() -> None:
    """What a replica that stops does to a kept-alive HTTP connection (measured in tests/test_swarm.py)."""
    from geventhttpclient.response import HTTPConnectionClosed

    error = to_client_error(HTTPConnectionClosed("connection closed."), "h:8000", 1.0)
    assert isinstance(error, ServerUnreachable) and RetryPolicy.reconnects(error)


@pytest.mark.parametrize(
    ("raised", "status", "kind"),
    [
        (ConnectionRefusedError(111, "Connection refused"), UNREACHABLE, ServerUnreachable),
        (socket.gaierror(-2, "Name or service not known"), UNREACHABLE, ServerUnreachable),
        (TimeoutError("timed out"), DEADLINE_EXCEEDED, ClientError),
    ],
)
def test_http_transport_exceptions_become_client_errors(raised: Exception, status: str, kind: type) -> None:
    error = to_client_error(raised, "h:8000", 2.5)
    assert type(error) is kind and error.status == status


def test_translated_errors_chains_the_original_and_ignores_other_exceptions() -> None:
    original = triton_error("StatusCode.INVALID_ARGUMENT", "NUM_BEAMS must be in 1..8")
    with pytest.raises(ClientError) as caught, translated_errors("h:8001", 1.0):
        raise original
    assert caught.value.__cause__ is original and caught.value.status == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(KeyError), translated_errors("h:8001", 1.0):
        raise KeyError("a bug stays a bug")


# --- clients over a fake transport -------------------------------


class FakeTriton:
    """A stand-in for tritonclient's InferenceServerClient (not a server): records calls, replays answers."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []
        self.closed = False

    def infer(self, model_name: str, inputs: list[Any], outputs: list[Any], **kwargs: Any) -> Any:
        self.calls.append({"model": model_name, "inputs": inputs, "outputs": outputs, **kwargs})
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        self.closed = True


class AsyncFakeTriton(FakeTriton):
    async def infer(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return super().infer(*args, **kwargs)

    async def close(self) -> None:  # type: ignore[override]
        self.closed = True


def test_default_urls_and_timeouts_per_protocol() -> None:
    assert Client().url == "127.0.0.1:8001" and Client(protocol="http").url == "127.0.0.1:8000"
    assert Client("http://example:9000/", protocol="HTTP").url == "example:9000"
    assert TRANSPORTS["grpc"].call_kwargs(5.0) == {"client_timeout": 5.0}
    assert TRANSPORTS["http"].call_kwargs(5.0) == {}
    assert normalize_url("grpc://h:1", transport_for("grpc")) == "h:1"
    with pytest.raises(ValueError, match="protocol"):
        Client(protocol="websocket")
    with pytest.raises(ValueError, match="timeout_s"):
        Client(timeout_s=0)
    assert Client(retry=None).retry == RetryPolicy.disabled()


def test_client_sends_one_request_and_decodes_it() -> None:
    client = Client(timeout_s=7.0)
    fake = client._triton = FakeTriton(grpc_result({"TRANSLATION": bytes_column(["I love you.", "Hi"])}))
    assert client.translate(["我爱你。", "嗨"], num_beams=2) == ["I love you.", "Hi"]
    (call,) = fake.calls
    assert call["model"] == "translate" and call["client_timeout"] == 7.0
    assert [i.name() for i in call["inputs"]] == ["TEXT", "NUM_BEAMS"]
    assert [o.name() for o in call["outputs"]] == ["TRANSLATION"]
    client.close()
    assert fake.closed


def test_client_retries_overload_then_returns() -> None:
    with Client(protocol="http", retry=NO_WAIT) as client:
        answer = grpc_result({"LABEL": bytes_column(["positive"]), "SCORE": np.array([[0.875]], dtype=np.float32)})
        client._triton = FakeTriton(triton_error("503", "busy"), answer)
        assert client.sentiment("这部电影不差") == [Sentiment("positive", 0.875)]
        assert "client_timeout" not in client._triton.calls[0]  # HTTP takes its timeout at construction


def test_client_raises_client_error_for_bad_input_without_retrying() -> None:
    client = Client(retry=NO_WAIT)
    client._triton = FakeTriton(triton_error("StatusCode.INVALID_ARGUMENT", "NUM_BEAMS must be in 1..8"))
    with pytest.raises(ClientError, match=r"\[StatusCode.INVALID_ARGUMENT\] NUM_BEAMS"):
        client.summarize("文本", num_beams=9)
    assert len(client._triton.calls) == 1


def test_async_client_shares_the_request_path() -> None:
    async def scenario() -> tuple[list[str], AsyncFakeTriton]:
        async with AsyncClient(retry=NO_WAIT) as client:
            fake = AsyncFakeTriton(
                triton_error("StatusCode.UNAVAILABLE", "queue full"),
                grpc_result({"SUMMARY": bytes_column(["标题"])}),
            )
            client._opened = fake
            summaries = await client.summarize("一段文本", max_new_tokens=24)
        return summaries, fake

    summaries, fake = asyncio.run(scenario())
    assert summaries == ["标题"] and len(fake.calls) == 2 and fake.closed
    assert [i.name() for i in fake.calls[0]["inputs"]] == ["TEXT", "MAX_NEW_TOKENS"]


def test_is_ready_says_false_when_nothing_listens() -> None:
    port = unused_port()
    for protocol in TRANSPORTS:
        with Client(f"127.0.0.1:{port}", protocol=protocol, timeout_s=2) as client:
            assert client.is_ready() is False
            assert client.is_ready("sentiment") is False
    with pytest.raises(ValueError, match="task"):
        Client().is_ready("poetry")


def test_async_is_ready_says_false_when_nothing_listens() -> None:
    port = unused_port()

    async def probe(protocol: str) -> bool:
        async with AsyncClient(f"127.0.0.1:{port}", protocol=protocol, timeout_s=2) as client:
            return await client.is_ready()

    assert [asyncio.run(probe(protocol)) for protocol in TRANSPORTS] == [False, False]


# --- CLI ---------------------------------------------------------


class FakeClient:
    """What `cli.run_task` needs from a Client: the three task methods. Records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str], dict[str, Any]]] = []

    def sentiment(self, texts: list[str]) -> list[Sentiment]:
        self.calls.append(("sentiment", texts, {}))
        return [Sentiment("positive" if "不差" in t else "negative", 0.98765) for t in texts]

    def translate(self, texts: list[str], **options: Any) -> list[str]:
        self.calls.append(("translate", texts, options))
        return [f"EN({t})" for t in texts]

    def summarize(self, texts: list[str], **options: Any) -> list[str]:
        self.calls.append(("summarize", texts, options))
        return [f"SUM({t})" for t in texts]

    def close(self) -> None:
        pass


def parse(*argv: str) -> Any:
    return cli.build_parser().parse_args(argv)


def test_cli_defaults() -> None:
    args = parse("sentiment", "好")
    assert (args.command, args.texts, args.url, args.protocol, args.timeout, args.attempts, args.json) == (
        "sentiment",
        ["好"],
        None,
        "grpc",
        30.0,
        3,
        False,
    )


def test_cli_global_flags_work_before_and_after_the_command() -> None:
    before = parse("--url", "h:1", "--protocol", "http", "--json", "translate", "我爱你。", "--beams", "4")
    after = parse("translate", "我爱你。", "--beams", "4", "--url", "h:1", "--protocol", "http", "--json")
    for args in (before, after):
        assert (args.url, args.protocol, args.json, args.num_beams, args.max_new_tokens) == (
            "h:1",
            "http",
            True,
            4,
            None,
        )
    assert parse("--timeout", "5", "summarize", "x", "--timeout", "9").timeout == 9.0


def test_cli_generation_flags_map_to_sdk_keywords() -> None:
    args = parse("translate", "我爱你。", "--num-beams", "2", "--max-new-tokens", "32")
    assert cli.task_options("translate", args) == {"max_new_tokens": 32, "num_beams": 2, "split_sentences": None}
    args = parse("translate", "我爱你。", "--split-sentences", "nonewlines")
    assert cli.task_options("translate", args)["split_sentences"] == "nonewlines"
    assert cli.task_options("sentiment", parse("sentiment", "x")) == {}


@pytest.mark.parametrize(
    "argv",
    [
        ["sentiment", "x", "--beams", "4"],  # sentiment has no beams
        ["translate"],  # no text
        ["poetry", "x"],
        ["--protocol", "ftp", "sentiment", "x"],
        ["sentiment", "x", "--timeout", "0"],
        ["sentiment", "x", "--attempts", "0"],
    ],
)
def test_cli_rejects_bad_command_lines_with_usage_exit(argv: list[str], capsys: Any) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(argv)
    assert caught.value.code == cli.EXIT_USAGE
    assert "usage:" in capsys.readouterr().err


def test_cli_string_option_flag_takes_only_its_choices(capsys: Any) -> None:
    parser = argparse.ArgumentParser(prog="summarize")
    cli.add_option_flags(parser, [MODE, *TRANSLATE.options.values()])
    args = parser.parse_args(["--mode", "extractive", "--beams", "3"])
    assert (args.mode, args.num_beams, args.max_new_tokens) == ("extractive", 3, None)
    assert parser.parse_args([]).mode is None  # unset: not sent, the server's default applies
    with pytest.raises(SystemExit) as caught:
        parser.parse_args(["--mode", "poetry"])
    assert caught.value.code == cli.EXIT_USAGE
    assert "invalid choice: 'poetry'" in capsys.readouterr().err
    assert "how to summarize, one of abstractive, extractive (server default: abstractive)" in " ".join(
        parser.format_help().split()
    )


def test_cli_help_shows_examples(capsys: Any) -> None:
    for argv in (["--help"], ["translate", "--help"]):
        with pytest.raises(SystemExit) as caught:
            cli.main(argv)
        assert caught.value.code == 0
    out = capsys.readouterr().out
    assert 'python -m clients sentiment "这部电影不差"' in out and "--max-new-tokens 32" in out


def test_dash_reads_non_empty_stdin_lines_in_place() -> None:
    stdin = io.StringIO("第一行\n\n  \n第二行\r\n")
    assert cli.read_texts(["前", "-", "后"], stdin) == ["前", "第一行", "第二行", "后"]


def test_sentiment_line_is_label_score_text() -> None:
    line = cli.format_result("sentiment", "这部电影不差", Sentiment("positive", 0.98765), as_json=False)
    assert line == "positive\t0.9877\t这部电影不差"


def test_text_output_stays_one_line_per_text() -> None:
    assert cli.format_result("translate", "x", "line one\nline two", as_json=False) == "line one line two"
    assert cli.format_result("sentiment", "a\nb", Sentiment("negative", 0.5), as_json=False) == "negative\t0.5000\ta b"


def test_json_output_is_one_object_per_text_with_unescaped_utf8() -> None:
    sentiment = cli.format_result("sentiment", "不差", Sentiment("positive", 0.9), as_json=True)
    assert json.loads(sentiment) == {"text": "不差", "label": "positive", "score": 0.9}
    assert "不差" in sentiment
    assert json.loads(cli.format_result("translate", "我", "I", as_json=True)) == {
        "text": "我",
        "translation": "I",
    }
    assert json.loads(cli.format_result("summarize", "长", "短", as_json=True)) == {
        "text": "长",
        "summary": "短",
    }


def test_run_task_batches_requests_and_keeps_order() -> None:
    client = FakeClient()
    texts = [f"t{i}" for i in range(5)]
    pairs = list(cli.run_task(client, "translate", texts, {"num_beams": 4, "max_new_tokens": None}, 2))
    assert pairs == [(t, f"EN({t})") for t in texts]
    assert [call[1] for call in client.calls] == [["t0", "t1"], ["t2", "t3"], ["t4"]]
    assert all(call[2] == {"num_beams": 4, "max_new_tokens": None} for call in client.calls)


def test_main_prints_one_line_per_text(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    created: list[tuple[Any, ...]] = []

    def fake_client(*args: Any) -> FakeClient:
        created.append(args)
        return FakeClient()

    monkeypatch.setattr(cli, "Client", fake_client)
    monkeypatch.setattr(sys, "stdin", io.StringIO("太难看了\n"))
    code = cli.main(["sentiment", "这部电影不差", "-", "--protocol", "http", "--attempts", "1"])
    assert code == cli.EXIT_OK
    assert capsys.readouterr().out.splitlines() == [
        "positive\t0.9877\t这部电影不差",
        "negative\t0.9877\t太难看了",
    ]
    ((url, protocol, timeout, retry),) = created
    assert (url, protocol, timeout, retry) == (None, "http", 30.0, RetryPolicy(max_attempts=1))


def test_main_reports_server_errors_on_one_line(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    class RejectingClient(FakeClient):
        url = "127.0.0.1:8001"

        def translate(self, texts: list[str], **options: Any) -> list[str]:
            raise ClientError("NUM_BEAMS must be\nin 1..8", "StatusCode.INVALID_ARGUMENT")

    monkeypatch.setattr(cli, "Client", lambda *args: RejectingClient())
    assert cli.main(["translate", "我爱你。", "--beams", "9"]) == cli.EXIT_REQUEST_FAILED
    assert capsys.readouterr().err == (
        "error: translate failed: [StatusCode.INVALID_ARGUMENT] NUM_BEAMS must be in 1..8\n"
    )


def test_main_with_empty_stdin_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n\n"))
    with pytest.raises(SystemExit) as caught:
        cli.main(["summarize", "-"])
    assert caught.value.code == cli.EXIT_USAGE


def test_option_the_sdk_refuses_is_a_usage_error(capsys: Any) -> None:
    assert cli.main(["--url", f"127.0.0.1:{unused_port()}", "translate", "x", "--beams", "9999999999"]) == 2
    assert "does not fit in INT32" in capsys.readouterr().err


# --- real network, no server -------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_cli_against_a_closed_port_fails_fast_with_a_clear_message(protocol: str) -> None:
    url = f"127.0.0.1:{unused_port()}"
    started = time.monotonic()
    finished = subprocess.run(
        [sys.executable, "-m", "clients", "--url", url, "--protocol", protocol, "sentiment", "这部电影不差"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == cli.EXIT_UNREACHABLE
    assert finished.stdout == ""
    assert finished.stderr.strip() == f"error: cannot reach Triton at {url} — is `make serve` running?"
    assert time.monotonic() - started < 15  # retries back off for well under a second in total


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_the_built_in_tasks_have_typed_methods_with_their_definitions_options(cls: type) -> None:
    import inspect

    from clients.task_definitions import registry

    built_in = {"sentiment", "translate", "summarize"}
    assert built_in <= set(registry())
    for task in built_in:
        method = vars(cls).get(task)  # written out in the class, not made by __getattr__
        assert method is not None, f"{cls.__name__}.{task} is not written out"
        assert inspect.iscoroutinefunction(method) is (cls is AsyncClient)
        parameters = inspect.signature(method).parameters.values()
        keywords = {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
        assert keywords == {option.keyword for option in registry()[task].options}, task


# --- reconnecting: a retry after "gone" or "going away" opens a new connection -----------------


@pytest.mark.parametrize(
    ("error", "reconnects"),
    [
        (ServerUnreachable("refused", UNREACHABLE), True),
        (ClientError("Request for unknown model: 'translate' has no available versions", "404"), True),
        (ClientError("queue full", "StatusCode.UNAVAILABLE"), False),  # the server is there, only busy
        (ClientError("bad text", "400"), False),
    ],
)
def test_a_retry_reconnects_only_when_the_server_is_gone_or_draining(error: ClientError, reconnects: bool) -> None:
    assert RetryPolicy.reconnects(error) is reconnects


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens once the probe closes


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_each_retry_after_an_unreachable_server_opens_a_new_connection(protocol: str) -> None:
    """Behind DNS that names several replicas (swarm's tasks.<service>, a headless Kubernetes service) a new
    connection is what moves a retry off a replica that went away; a kept one would try the same replica again."""
    port = closed_port()
    url = f"127.0.0.1:{port}" if protocol == "grpc" else f"http://127.0.0.1:{port}"
    client = Client(url, protocol, timeout_s=5, retry=RetryPolicy(max_attempts=3, base_delay_s=0.0))
    used = []
    transport = client.transport

    class CountingOpens:
        def __getattr__(self, name: str) -> Any:
            return getattr(transport, name)

        def open(self, *args: Any, **kwargs: Any) -> Any:
            used.append(transport.open(*args, **kwargs))
            return used[-1]

    client.transport = CountingOpens()  # type: ignore[assignment]
    with pytest.raises(ServerUnreachable):
        client.sentiment("好")
    assert len(used) == 3 and client._triton is used[-1]  # one new connection after each of the 3 failures
    client.close()


def test_the_async_client_reconnects_too_and_closes_what_it_left() -> None:
    port = closed_port()

    async def scenario() -> tuple[int, int]:
        client = AsyncClient(f"127.0.0.1:{port}", timeout_s=5, retry=RetryPolicy(max_attempts=3, base_delay_s=0.0))
        with pytest.raises(ServerUnreachable):
            await client.sentiment("好")
        left = len(client._closing)
        await client.close()
        return left, len(client._closing)

    left, after_close = asyncio.run(scenario())
    assert left == 3 and after_close == 0  # each failure left its connection to close; close() closed them all


def test_a_stream_that_fails_before_its_first_piece_is_opened_again() -> None:
    from clients.streaming import retried_start

    draining = ClientError("Request for unknown model: 'translate_stream' has no available versions", "404")
    opened: list[int] = []

    def open_stream(pieces: list[str | ClientError]):
        def stream():
            opened.append(1)
            for piece in pieces:
                if isinstance(piece, ClientError):
                    raise piece
                yield piece

        return stream

    fast = RetryPolicy(max_attempts=3, base_delay_s=0.0)
    attempts = iter([[draining], ["I ", "love you."]])
    assert list(retried_start(lambda: open_stream(next(attempts))(), fast)) == ["I ", "love you."]
    assert len(opened) == 2
    opened.clear()  # a failure after a piece reached the caller is not repeated: the caller would see it twice
    with pytest.raises(ClientError, match="no available versions"):
        list(retried_start(open_stream(["I ", draining]), fast))
    assert len(opened) == 1
    opened.clear()  # nor is a mistake of the request's
    with pytest.raises(ClientError, match="bad text"):
        list(retried_start(open_stream([ClientError("bad text", "400")]), fast))
    assert len(opened) == 1
