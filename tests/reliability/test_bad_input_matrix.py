"""Every kind of bad input, for every public model, over gRPC and HTTP, against the real server.

Each case gets an error that names the field (INVALID_ARGUMENT / HTTP 400) or, where the contract says so, an
answer (long texts are truncated; odd but readable text is text). Afterwards the server still answers.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from reliability_helpers import CLIENTS, OUTPUT, PUBLIC_MODELS, connect, infer, int_input, text_input
from tritonclient.utils import InferenceServerException

MAX_BATCH = 64

# name → (texts, expected error regex or None for "answered")
TEXT_CASES = {
    "empty": ([""], r"TEXT\[0\] is empty"),
    "whitespace_only": (["  \t\n\u3000 "], r"TEXT\[0\] is empty"),
    "control_only": (["\x00\x01\x1b\x7f"], r"TEXT\[0\] is empty, whitespace-only or holds only control"),
    "invalid_utf8": ([b"\xff\xfe\xfa"], r"TEXT\[0\] is not valid UTF-8"),
    "invalid_utf8_second_row": (["很好", b"ok\xc3("], r"TEXT\[1\] is not valid UTF-8"),
    "100k_characters": (["好" * 100_000], None),
    "over_1_MiB": (["好" * 400_000], r"TEXT\[0\] is 1,200,000 bytes; the limit is 1,048,576 bytes"),
    "nul_and_controls_inside": (["服务\x00很好\x07，\x1b下次再来"], None),
    "mixed_scripts_and_emoji": (["Hello 世界 😀 مرحبا Привет こんにちは 🇨🇳"], None),
}


@pytest.fixture(params=["grpc", "http"])
def protocol(request) -> str:
    return request.param


@pytest.fixture(params=PUBLIC_MODELS)
def model(request) -> str:
    return request.param


def refused(client, model: str, inputs: list) -> str:
    """The error message of a request that must fail; asserts it is a client error, not a server fault."""
    with pytest.raises(InferenceServerException) as info:
        infer(client, model, inputs)
    status = str(info.value.status())
    assert status in ("StatusCode.INVALID_ARGUMENT", "400"), f"{status}: {info.value.message()}"
    return info.value.message()


@pytest.mark.parametrize("case", TEXT_CASES)
def test_text_cases(triton, protocol: str, model: str, case: str) -> None:
    texts, expected = TEXT_CASES[case]
    module = CLIENTS[protocol]
    with connect(triton, protocol) as client:
        inputs = [text_input(module, texts)]
        if expected is None:
            result = infer(client, model, inputs)
            out = result.as_numpy(OUTPUT[model])
            assert out.shape == (len(texts), 1) and all(len(v) > 0 for v in out[:, 0])
        else:
            assert expected and re.search(expected, refused(client, model, inputs))


def test_wrong_datatype(triton, protocol: str, model: str) -> None:
    module = CLIENTS[protocol]
    tensor = module.InferInput("TEXT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[7]], dtype=np.int32))
    with connect(triton, protocol) as client:
        message = refused(client, model, [tensor])
    assert "TEXT" in message and "INT32" in message


@pytest.mark.parametrize("shape", [[1, 2], [2]])
def test_wrong_shape(triton, protocol: str, model: str, shape: list[int]) -> None:
    module = CLIENTS[protocol]
    tensor = module.InferInput("TEXT", shape, "BYTES")
    tensor.set_data_from_numpy(np.array(["好"] * int(np.prod(shape)), dtype=np.object_).reshape(shape))
    with connect(triton, protocol) as client:
        assert "TEXT" in refused(client, model, [tensor])


def test_missing_required_input(triton, protocol: str, model: str) -> None:
    module = CLIENTS[protocol]
    # The generation endpoints take optional inputs: send one of those without TEXT; sentiment gets a stray one.
    only = int_input(module, "NUM_BEAMS" if model != "sentiment" else "EXTRA", 2, 1)
    with connect(triton, protocol) as client:
        message = refused(client, model, [only])
    assert "TEXT" in message or "EXTRA" in message


def test_unknown_extra_input(triton, protocol: str, model: str) -> None:
    module = CLIENTS[protocol]
    with connect(triton, protocol) as client:
        message = refused(client, model, [text_input(module, ["很好"]), text_input(module, ["x"], name="COLOR")])
    assert "COLOR" in message


def test_batch_larger_than_max_batch_size(triton, protocol: str, model: str) -> None:
    module = CLIENTS[protocol]
    with connect(triton, protocol) as client:
        message = refused(client, model, [text_input(module, ["很好"] * (MAX_BATCH + 1))])
    assert "batch" in message and str(MAX_BATCH) in message


@pytest.mark.parametrize(
    ("field", "value"), [("NUM_BEAMS", 0), ("NUM_BEAMS", 9), ("MAX_NEW_TOKENS", 0), ("MAX_NEW_TOKENS", 100_000)]
)
@pytest.mark.parametrize("generation_model", ["translate", "summarize"])
def test_optional_input_out_of_range(triton, protocol: str, generation_model: str, field: str, value: int) -> None:
    module = CLIENTS[protocol]
    inputs = [text_input(module, ["我爱你。"]), int_input(module, field, value, 1)]
    with connect(triton, protocol) as client:
        message = refused(client, generation_model, inputs)
    assert f"{field} must be between" in message and str(value) in message


def test_server_still_answers_every_model_afterwards(triton, protocol: str) -> None:
    module = CLIENTS[protocol]
    with connect(triton, protocol) as client:
        assert client.is_server_live() and client.is_server_ready()
        for model in PUBLIC_MODELS:
            result = infer(client, model, [text_input(module, ["今天天气很好。"])])
            assert result.as_numpy(OUTPUT[model]).shape == (1, 1)
