"""What the three Triton models expect and return, written once for every client and transport.

Each public model takes a batch of UTF-8 strings as ``TEXT`` (BYTES, shape [N, 1]) plus optional INT32 knobs
(shape [N, 1], the same value on every row because the model batches rows from different requests), and
answers with one row per input. Only the model name, the knobs and how to read the answer differ: that is
`Endpoint`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from .errors import BAD_RESPONSE, ClientError

T = TypeVar("T")

TEXT_INPUT = "TEXT"
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class Sentiment:
    """The model's verdict on one text: `label` is "positive" or "negative", `score` its probability."""

    label: str
    score: float


class InferResultLike(Protocol):
    """The part of tritonclient's gRPC and HTTP `InferResult` that decoding needs."""

    def as_numpy(self, name: str) -> np.ndarray | None: ...


class InferInputFactory(Protocol):
    """`tritonclient.grpc.InferInput` or `tritonclient.http.InferInput` (same constructor, different wire)."""

    def __call__(self, name: str, shape: list[int], datatype: str) -> Any: ...


Decoder = Callable[[InferResultLike, int], list[T]]


@dataclass(frozen=True)
class Endpoint(Generic[T]):
    """One public Triton model: its name, outputs, optional INT32 inputs and how to read its answer."""

    model: str
    outputs: tuple[str, ...]
    decode: Decoder[T]
    int_options: Mapping[str, str] = field(default_factory=dict)  # Python keyword -> Triton input name


def normalize_texts(texts: str | Sequence[str]) -> list[str]:
    """A lone str is a batch of one; anything else must be a non-empty sequence of str.

    Checking types here turns a confusing server-side BYTES error into a Python error at the call site;
    what the texts say (length, language) is left to the server, which owns those rules.
    """
    if isinstance(texts, str):
        return [texts]
    if isinstance(texts, bytes | bytearray) or not isinstance(texts, Sequence):
        raise TypeError(f"texts must be a str or a sequence of str, got {type(texts).__name__}")
    batch = list(texts)
    if not batch:
        raise ValueError("texts is empty: give at least one text")
    for index, text in enumerate(batch):
        if not isinstance(text, str):
            raise TypeError(f"texts[{index}] must be a str, got {type(text).__name__}")
    return batch


def text_tensor(texts: Sequence[str]) -> np.ndarray:
    """The ``TEXT`` tensor: one UTF-8 encoded row per text, shape [N, 1], dtype object (Triton BYTES)."""
    return np.array([[text.encode("utf-8")] for text in texts], dtype=np.object_).reshape(len(texts), 1)


def int_option_tensor(keyword: str, value: int, rows: int) -> np.ndarray:
    """An INT32 [rows, 1] tensor repeating `value`, after checking it is an int that fits in INT32."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{keyword} must be an int, got {type(value).__name__}")
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"{keyword}={value} does not fit in INT32")
    return np.full((rows, 1), value, dtype=np.int32)


def build_inputs(
    endpoint: Endpoint[Any],
    texts: Sequence[str],
    options: Mapping[str, int | None],
    infer_input: InferInputFactory,
) -> list[Any]:
    """The InferInput list for one request; options left as None are not sent, so server defaults apply."""
    unknown = set(options) - set(endpoint.int_options)
    if unknown:
        raise TypeError(f"{endpoint.model} does not take {', '.join(sorted(unknown))}")
    tensors = {TEXT_INPUT: text_tensor(texts)}
    for keyword, value in options.items():
        if value is not None:
            tensors[endpoint.int_options[keyword]] = int_option_tensor(keyword, value, len(texts))
    return [_to_infer_input(name, array, infer_input) for name, array in tensors.items()]


def _to_infer_input(name: str, array: np.ndarray, infer_input: InferInputFactory) -> Any:
    datatype = "BYTES" if array.dtype == np.object_ else "INT32"
    tensor = infer_input(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def output_rows(result: InferResultLike, name: str, rows: int) -> np.ndarray:
    """Output `name` with one entry (of any shape) per input row; `ClientError` if the server broke the contract."""
    array = result.as_numpy(name)
    if array is None:
        raise ClientError(f"the server's response has no output {name!r}", BAD_RESPONSE)
    found = array.shape[0] if array.ndim else 0
    if found != rows:
        raise ClientError(f"output {name!r} has {found} rows for {rows} texts", BAD_RESPONSE)
    return array


def output_column(result: InferResultLike, name: str, rows: int) -> np.ndarray:
    """Output `name` as one value per input row; `ClientError` if the server broke the contract."""
    column = output_rows(result, name, rows)
    if column.size != rows:
        raise ClientError(f"output {name!r} has {column.size} values for {rows} texts", BAD_RESPONSE)
    return column.reshape(-1)


def as_text(value: bytes | str) -> str:
    """A BYTES element as str (binary HTTP/gRPC gives bytes; JSON HTTP responses give str)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def decode_sentiment(result: InferResultLike, rows: int) -> list[Sentiment]:
    labels = output_column(result, "LABEL", rows)
    scores = output_column(result, "SCORE", rows)
    return [Sentiment(as_text(label), float(score)) for label, score in zip(labels, scores, strict=True)]


def text_decoder(output: str) -> Decoder[str]:
    """A decoder for models whose only output is one string per row."""

    def decode(result: InferResultLike, rows: int) -> list[str]:
        return [as_text(value) for value in output_column(result, output, rows)]

    return decode


GENERATION_OPTIONS: Mapping[str, str] = {"max_new_tokens": "MAX_NEW_TOKENS", "num_beams": "NUM_BEAMS"}

SENTIMENT: Endpoint[Sentiment] = Endpoint("sentiment", ("LABEL", "SCORE"), decode_sentiment)
TRANSLATE: Endpoint[str] = Endpoint("translate", ("TRANSLATION",), text_decoder("TRANSLATION"), GENERATION_OPTIONS)
SUMMARIZE: Endpoint[str] = Endpoint("summarize", ("SUMMARY",), text_decoder("SUMMARY"), GENERATION_OPTIONS)

ENDPOINTS: Mapping[str, Endpoint[Any]] = {e.model: e for e in (SENTIMENT, TRANSLATE, SUMMARIZE)}
