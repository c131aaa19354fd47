"""What the Triton endpoints expect and return, derived from the task definitions (``tasks/*.toml``).

Each public model takes a batch of UTF-8 strings as ``TEXT`` (BYTES, shape [N, 1]) plus optional knobs: INT32, or
BYTES for a knob that takes one of a few strings (shape [N, 1], the same value on every row because the model
batches rows from different requests), and answers with one row per input. Only the model name, the knobs and how to
read the answer differ: that is `Endpoint`, built from a task's definition by :func:`endpoint`. A task with one
output answers with that value per text (a str for a text output); a task with several answers with an instance of
its ``result`` class, a frozen dataclass whose fields are the outputs' names in lower case
(``Sentiment(label, score)``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, make_dataclass
from functools import cache
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from numpy.typing import NDArray

from .errors import BAD_RESPONSE, ClientError
from .task_definitions import TEXT_INPUT, Option, Task, get, registry

T = TypeVar("T")

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
PYTHON_TYPES = {"string": str, "fp32": float, "int32": int, "int64": int}


class InferResultLike(Protocol):
    """The part of tritonclient's gRPC and HTTP `InferResult` that decoding needs."""

    def as_numpy(self, name: str) -> NDArray[Any] | None: ...


class InferInputFactory(Protocol):
    """`tritonclient.grpc.InferInput` or `tritonclient.http.InferInput` (same constructor, different wire)."""

    def __call__(self, name: str, shape: list[int], datatype: str) -> Any: ...


Decoder = Callable[[InferResultLike, int], list[T]]


@dataclass(frozen=True)
class Endpoint(Generic[T]):
    """One public Triton model: its name, outputs, optional inputs and how to read its answer."""

    model: str
    outputs: tuple[str, ...]
    decode: Decoder[T]
    options: Mapping[str, Option] = field(default_factory=dict)  # Python keyword -> the option it sets


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


def text_tensor(texts: Sequence[str]) -> NDArray[Any]:
    """The ``TEXT`` tensor: one UTF-8 encoded row per text, shape [N, 1], dtype object (Triton BYTES)."""
    return np.array([[text.encode("utf-8")] for text in texts], dtype=np.object_).reshape(len(texts), 1)


def int_option_tensor(keyword: str, value: object, rows: int) -> NDArray[Any]:
    """An INT32 [rows, 1] tensor repeating `value`, after checking it is an int that fits in INT32."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{keyword} must be an int, got {type(value).__name__}")
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"{keyword}={value} does not fit in INT32")
    return np.full((rows, 1), value, dtype=np.int32)


def string_option_tensor(keyword: str, value: object, rows: int) -> NDArray[Any]:
    """A BYTES [rows, 1] tensor repeating `value` as UTF-8, after checking it is a str. Like an int's range,
    whether it is one of the option's choices is left to the server, whose error names them."""
    if not isinstance(value, str):
        raise TypeError(f"{keyword} must be a str, got {type(value).__name__}")
    return np.full((rows, 1), value.encode("utf-8"), dtype=np.object_)


def option_tensor(option: Option, value: int | str, rows: int) -> NDArray[Any]:
    """The tensor of `option` set to `value` on every row: BYTES for a string option, else INT32."""
    if option.choices:
        return string_option_tensor(option.keyword, value, rows)
    return int_option_tensor(option.keyword, value, rows)


def build_inputs(
    endpoint: Endpoint[Any],
    texts: Sequence[str],
    options: Mapping[str, int | str | None],
    infer_input: InferInputFactory,
) -> list[Any]:
    """The InferInput list for one request; options left as None are not sent, so server defaults apply."""
    unknown = set(options) - set(endpoint.options)
    if unknown:
        raise TypeError(f"{endpoint.model} does not take {', '.join(sorted(unknown))}")
    tensors = {TEXT_INPUT: text_tensor(texts)}
    for keyword, value in options.items():
        if value is not None:
            option = endpoint.options[keyword]
            tensors[option.input] = option_tensor(option, value, len(texts))
    return [to_infer_input(name, array, infer_input) for name, array in tensors.items()]


def datatype_of(array: NDArray[Any]) -> str:
    """The Triton datatype of a request tensor: text (dtype object) goes as BYTES, every option as INT32."""
    return "BYTES" if array.dtype == np.object_ else "INT32"


def to_infer_input(name: str, array: NDArray[Any], infer_input: InferInputFactory) -> Any:
    """`array` as tritonclient's ``InferInput`` (gRPC or HTTP, sync or asyncio: ``infer_input`` is its class)."""
    tensor = infer_input(name, list(array.shape), datatype_of(array))
    tensor.set_data_from_numpy(array)
    return tensor


def output_rows(result: InferResultLike, name: str, rows: int) -> NDArray[Any]:
    """Output `name` with one entry (of any shape) per input row; `ClientError` if the server broke the contract."""
    array = result.as_numpy(name)
    if array is None:
        raise ClientError(f"the server's response has no output {name!r}", BAD_RESPONSE)
    found = array.shape[0] if array.ndim else 0
    if found != rows:
        raise ClientError(f"output {name!r} has {found} rows for {rows} texts", BAD_RESPONSE)
    return array


def output_column(result: InferResultLike, name: str, rows: int) -> NDArray[Any]:
    """Output `name` as one value per input row; `ClientError` if the server broke the contract."""
    column = output_rows(result, name, rows)
    if column.size != rows:
        raise ClientError(f"output {name!r} has {column.size} values for {rows} texts", BAD_RESPONSE)
    return column.reshape(-1)


def as_text(value: bytes | str) -> str:
    """A BYTES element as str (binary HTTP/gRPC gives bytes; JSON HTTP responses give str)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def column_decoder(output: str, kind: str) -> Callable[[InferResultLike, int], list[Any]]:
    """One value per row of `output`: str for text outputs, float or int for numbers."""
    convert = as_text if kind == "string" else PYTHON_TYPES[kind]

    def decode(result: InferResultLike, rows: int) -> list[Any]:
        return [convert(value) for value in output_column(result, output, rows)]

    return decode


def text_decoder(output: str) -> Decoder[str]:
    """A decoder for models whose only output is one string per row."""
    return column_decoder(output, "string")


@cache
def result_class(task: Task) -> type:
    """The frozen dataclass a task with several outputs answers with, named by its definition's ``result``."""
    fields = [(t.name.lower(), PYTHON_TYPES[t.type]) for t in task.endpoint.outputs]
    cls = make_dataclass(task.result, fields, frozen=True)
    cls.__module__ = __name__
    cls.__doc__ = f"`{task.name}`'s answer for one text: {', '.join(name for name, _ in fields)}."
    return cls


def _decoder(task: Task) -> Decoder[Any]:
    outputs = task.endpoint.outputs
    if len(outputs) == 1:
        return column_decoder(outputs[0].name, outputs[0].type)
    columns = [column_decoder(t.name, t.type) for t in outputs]
    cls = result_class(task)

    def decode(result: InferResultLike, rows: int) -> list[Any]:
        return [cls(*values) for values in zip(*(column(result, rows) for column in columns), strict=True)]

    return decode


def options_of(task: Task) -> Mapping[str, Option]:
    """Python keyword -> option, for the task's options."""
    return {option.keyword: option for option in task.options}


@cache
def _endpoint(task: Task) -> Endpoint[Any]:
    outputs = tuple(t.name for t in task.endpoint.outputs)
    return Endpoint(task.name, outputs, _decoder(task), options_of(task))


def endpoint(task: str) -> Endpoint[Any]:
    """The endpoint of `task` (``ValueError`` naming the known tasks if there is none)."""
    return _endpoint(get(task))


def endpoints() -> dict[str, Endpoint[Any]]:
    """Every task's endpoint, built-in and from ``$ROPESERVE_TASKS_PATH``."""
    return {name: _endpoint(task) for name, task in registry().items()}


Sentiment = result_class(get("sentiment"))
