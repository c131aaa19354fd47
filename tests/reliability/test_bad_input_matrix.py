"""Every kind of bad input, for every public model, over gRPC and HTTP, against the real server.

Each case gets an error that names the field (INVALID_ARGUMENT / HTTP 400) or, where the contract says so, an
answer (long texts are read in windows or truncated, translate's up to its document limit; odd but readable
text is text). Afterwards the server still answers.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from reliability_helpers import CLIENTS, OUTPUT, PUBLIC_MODELS, connect, infer, int_input, text_input
from tritonclient.utils import InferenceServerException

from serving.frontends.base import MAX_TEXT_BYTES
from tasks.definition import get

# name → (texts, expected error regex or None for "answered")
TEXT_CASES = {
    "empty": ([""], r"TEXT\[0\] is empty"),
    "whitespace_only": (["  \t\n\u3000 "], r"TEXT\[0\] is empty"),
    "control_only": (["\x00\x01\x1b\x7f"], r"TEXT\[0\] is empty, whitespace-only or holds only control"),
    "invalid_utf8": ([b"\xff\xfe\xfa"], r"TEXT\[0\] is not valid UTF-8"),
    "invalid_utf8_second_row": (["很好", b"ok\xc3("], r"TEXT\[1\] is not valid UTF-8"),
    "100k_characters": (["好" * 100_000], None),
    "at_the_size_limit": (["好" * (MAX_TEXT_BYTES // 3) + "a" * (MAX_TEXT_BYTES % 3)], None),
    "one_byte_over_the_size_limit": (
        ["好" * (MAX_TEXT_BYTES // 3) + "a" * (MAX_TEXT_BYTES % 3 + 1)],
        rf"TEXT\[0\] is {MAX_TEXT_BYTES + 1:,} bytes; the limit is {MAX_TEXT_BYTES:,} bytes",
    ),
    "nul_and_controls_inside": (["服务\x00很好\x07，\x1b下次再来"], None),
    "mixed_scripts_and_emoji": (["Hello 世界 😀 مرحبا Привет こんにちは 🇨🇳"], None),
}
# translate reads a text as a document of sentences, up to its own limit (the others read a long text in windows)
MAX_DOCUMENT_CHARS = get("translate").engine.max_document_chars
DOCUMENT_LIMIT = rf"TEXT\[0\] has [\d,]+ characters; the limit is {MAX_DOCUMENT_CHARS:,} characters per text"
PER_MODEL = {("translate", "100k_characters"): DOCUMENT_LIMIT, ("translate", "at_the_size_limit"): DOCUMENT_LIMIT}


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
    expected = PER_MODEL.get((model, case), expected)
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


def max_batch_size(client, model: str) -> int:
    """The limit the server loaded for `model` (gRPC answers a message, HTTP a dict)."""
    config = client.get_model_config(model)
    return config.config.max_batch_size if hasattr(config, "config") else config["max_batch_size"]


def test_batch_larger_than_max_batch_size(triton, protocol: str, model: str) -> None:
    module = CLIENTS[protocol]
    with connect(triton, protocol) as client:
        limit = max_batch_size(client, model)
        message = refused(client, model, [text_input(module, ["很好"] * (limit + 1))])
    assert "batch" in message and str(limit) in message


# The cheapest setting of the other option, so that answered requests at the range's ends stay fast.
CHEAP = {"NUM_BEAMS": ("MAX_NEW_TOKENS", 4), "MAX_NEW_TOKENS": ("NUM_BEAMS", 1)}


@pytest.mark.parametrize("field", ["NUM_BEAMS", "MAX_NEW_TOKENS"])
@pytest.mark.parametrize("generation_model", ["translate", "summarize"])
def test_optional_input_range_is_the_announced_one(triton, protocol: str, generation_model: str, field: str) -> None:
    """A value far outside the range is refused with the range; both of its ends are answered, one past either
    end is refused."""
    module = CLIENTS[protocol]

    def inputs(value: int) -> list:
        other, cheap = CHEAP[field]
        options = [int_input(module, field, value, 1), int_input(module, other, cheap, 1)]
        return [text_input(module, ["我爱你。"]), *options]

    with connect(triton, protocol) as client:
        message = refused(client, generation_model, inputs(2**31 - 1))
        announced = re.search(rf"{field} must be between (\d+) and (\d+)", message)
        assert announced, message
        low, high = map(int, announced.groups())
        for value in (low, high):
            assert infer(client, generation_model, inputs(value)).as_numpy(OUTPUT[generation_model]).shape == (1, 1)
        for value in (low - 1, high + 1):
            message = refused(client, generation_model, inputs(value))
            assert f"{field} must be between {low} and {high}" in message and str(value) in message


def test_server_still_answers_every_model_afterwards(triton, protocol: str) -> None:
    module = CLIENTS[protocol]
    with connect(triton, protocol) as client:
        assert client.is_server_live() and client.is_server_ready()
        for model in PUBLIC_MODELS:
            result = infer(client, model, [text_input(module, ["今天天气很好。"])])
            assert result.as_numpy(OUTPUT[model]).shape == (1, 1)
