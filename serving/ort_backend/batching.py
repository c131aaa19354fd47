"""Turn the requests of one dynamic batch into as few ONNX Runtime calls as possible, and back.

Triton's dynamic batcher hands ``execute()`` a list of requests. One ``session.run`` per request would waste
the batch, so requests whose inputs agree on dtype and on every non-batch dimension are concatenated along
axis 0 and run together; the outputs are then sliced back per request. A request that is invalid (missing
input, wrong dtype, wrong rank or dimension) gets its own error message and does not spoil the others.

Pure numpy: no Triton import, so unit tests run it without a server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Triton model-config data types -> numpy dtypes. TYPE_STRING tensors are numpy object arrays.
# TYPE_BF16 is missing on purpose: numpy has no bfloat16, so such a model is refused at load time.
TRITON_TO_NUMPY: dict[str, np.dtype] = {
    "TYPE_BOOL": np.dtype(np.bool_),
    "TYPE_UINT8": np.dtype(np.uint8),
    "TYPE_UINT16": np.dtype(np.uint16),
    "TYPE_UINT32": np.dtype(np.uint32),
    "TYPE_UINT64": np.dtype(np.uint64),
    "TYPE_INT8": np.dtype(np.int8),
    "TYPE_INT16": np.dtype(np.int16),
    "TYPE_INT32": np.dtype(np.int32),
    "TYPE_INT64": np.dtype(np.int64),
    "TYPE_FP16": np.dtype(np.float16),
    "TYPE_FP32": np.dtype(np.float32),
    "TYPE_FP64": np.dtype(np.float64),
    "TYPE_STRING": np.dtype(object),
}


class RequestError(ValueError):
    """One request cannot be run; the message names the input and what was expected."""


@dataclass(frozen=True)
class TensorSpec:
    """One ``input``/``output`` entry of the model config. ``dims`` excludes the batch dimension."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    optional: bool = False

    @property
    def dtype(self) -> np.dtype:
        return TRITON_TO_NUMPY[self.data_type]

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> TensorSpec:
        """Read one entry of the JSON model config that Triton passes to the backend."""
        data_type = entry["data_type"]
        if data_type not in TRITON_TO_NUMPY:
            raise ValueError(f"tensor '{entry['name']}': data type {data_type} is not supported by this backend")
        dims = tuple(int(d) for d in entry.get("reshape", {}).get("shape", entry.get("dims", [])))
        return cls(entry["name"], data_type, dims, bool(entry.get("optional", False)))

    def describe(self, batched: bool) -> str:
        """Human-readable expected shape, e.g. ``TYPE_FP32 [batch, -1, 4]``."""
        shape = ", ".join(["batch", *map(str, self.dims)] if batched else map(str, self.dims))
        return f"{self.data_type} [{shape}]"


def validate_request(
    tensors: Mapping[str, np.ndarray], specs: Sequence[TensorSpec], batched: bool
) -> dict[str, np.ndarray]:
    """Check one request's inputs against the config and return the ORT feed (absent optionals left out).

    Triton core already rejects most malformed requests from clients; this guards BLS calls and anything
    that slips through, and it must name the offending input so a caller can fix it.
    """
    feed: dict[str, np.ndarray] = {}
    batch_size: int | None = None
    for spec in specs:
        array = tensors.get(spec.name)
        if array is None:
            if spec.optional:
                continue
            raise RequestError(f"missing input '{spec.name}': expected {spec.describe(batched)}")
        if array.dtype != spec.dtype and not (spec.dtype.kind == "O" and array.dtype.kind in "OSU"):
            raise RequestError(f"input '{spec.name}' has dtype {array.dtype}, expected {spec.data_type} ({spec.dtype})")
        expected_rank = len(spec.dims) + (1 if batched else 0)
        if array.ndim != expected_rank:
            raise RequestError(
                f"input '{spec.name}' has shape {list(array.shape)} (rank {array.ndim}), "
                f"expected rank {expected_rank}: {spec.describe(batched)}"
            )
        inner = array.shape[1:] if batched else array.shape
        for axis, (got, want) in enumerate(zip(inner, spec.dims, strict=True)):
            if want != -1 and got != want:
                raise RequestError(
                    f"input '{spec.name}' has shape {list(array.shape)}, expected {spec.describe(batched)} "
                    f"(dimension {axis + (1 if batched else 0)} must be {want})"
                )
        if batched:
            if batch_size is None:
                batch_size = array.shape[0]
            elif array.shape[0] != batch_size:
                raise RequestError(
                    f"input '{spec.name}' has batch size {array.shape[0]}, but other inputs of the same "
                    f"request have batch size {batch_size}"
                )
        feed[spec.name] = to_ort_array(array)
    return feed


def to_ort_array(array: np.ndarray) -> np.ndarray:
    """ORT wants ``str`` in string tensors; Triton hands over ``bytes`` (which ORT would ``str()``)."""
    if array.dtype.kind == "S" or (array.dtype.kind == "O" and array.size and isinstance(array.flat[0], bytes)):
        return np.array([v.decode("utf-8") if isinstance(v, bytes) else v for v in array.flat], dtype=object).reshape(
            array.shape
        )
    return array


@dataclass
class Group:
    """Requests that run in one ``session.run``: their positions, batch sizes and the concatenated feed."""

    indices: list[int] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    parts: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def feed(self) -> dict[str, np.ndarray]:
        """Concatenate along axis 0 (no copy when the group holds one request)."""
        return {name: arrays[0] if len(arrays) == 1 else np.concatenate(arrays) for name, arrays in self.parts.items()}


def _group_key(feed: Mapping[str, np.ndarray]) -> tuple:
    return tuple(sorted((name, array.dtype.str, array.shape[1:]) for name, array in feed.items()))


def group_feeds(feeds: Sequence[tuple[int, Mapping[str, np.ndarray]]], batched: bool) -> list[Group]:
    """Group validated feeds (``(request index, feed)``) that can share one run, keeping request order.

    Without a batch dimension (``max_batch_size: 0``) nothing can be concatenated: one group per request.
    """
    groups: dict[Any, Group] = {}
    for index, feed in feeds:
        key = _group_key(feed) if batched else index
        group = groups.setdefault(key, Group())
        group.indices.append(index)
        group.batch_sizes.append(next(iter(feed.values())).shape[0] if batched and feed else 1)
        for name, array in feed.items():
            group.parts.setdefault(name, []).append(array)
    return list(groups.values())


def plan_batches(
    requests: Sequence[Mapping[str, np.ndarray]], specs: Sequence[TensorSpec], batched: bool
) -> tuple[list[Group], dict[int, str]]:
    """Validate every request and group the valid ones. Returns the groups and ``{index: error message}``."""
    errors: dict[int, str] = {}
    valid: list[tuple[int, dict[str, np.ndarray]]] = []
    for index, tensors in enumerate(requests):
        try:
            valid.append((index, validate_request(tensors, specs, batched)))
        except RequestError as exc:
            errors[index] = str(exc)
    return group_feeds(valid, batched), errors


def split_outputs(outputs: Mapping[str, np.ndarray], batch_sizes: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Slice each output along axis 0 back into one dict per request of the group."""
    if len(batch_sizes) == 1:
        return [dict(outputs)]
    total = sum(batch_sizes)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise ValueError(
                f"output '{name}' has shape {list(array.shape)}; its first dimension should be the batch ({total})"
            )
    bounds = np.cumsum([0, *batch_sizes])
    return [
        {name: array[start:stop] for name, array in outputs.items()}
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True)
    ]
