"""Read a Triton ONNX model config the way the native onnxruntime backend does, for ONNX Runtime on CPU.

The same ``config.pbtxt`` must serve unchanged on the NGC image (native backend) and on the embedded server
(this backend), so the keys are the native ones (triton-inference-server/onnxruntime_backend README):

- ``parameters``: ``intra_op_thread_count``, ``inter_op_thread_count``, ``execution_mode``
  (0 sequential, 1 parallel), ``enable_mem_arena``, ``enable_mem_pattern``,
  ``session.use_device_allocator_for_initializers``, ``memory.enable_memory_arena_shrinkage`` (a run option);
- ``optimization { graph { level } }``: -1 basic, 1 extended, 2 disabled, absent/0 all.

One deliberate difference: when ``intra_op_thread_count`` is absent, the CPU cores are split between the
model's instances instead of every instance taking all cores (ORT's default, which oversubscribes a small
machine). ``"0"`` still means "let ORT choose", as in the native backend.

GPU-only fields (``execution_accelerators``, ``KIND_GPU``) are not read here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .batching import TensorSpec

# ONNX Runtime's type strings -> Triton data types.
ORT_TO_TRITON: dict[str, str] = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(bfloat16)": "TYPE_BF16",
    "tensor(string)": "TYPE_STRING",
}

GRAPH_LEVELS = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}
DEFAULT_GRAPH_LEVEL = "ORT_ENABLE_ALL"
ARENA_SHRINKAGE_KEY = "memory.enable_memory_arena_shrinkage"
SESSION_ENTRY_KEYS = ("session.use_device_allocator_for_initializers",)


@dataclass(frozen=True)
class OrtSettings:
    """Everything needed to build the ``SessionOptions`` and ``RunOptions`` of one model instance."""

    intra_op_threads: int
    inter_op_threads: int = 0
    parallel_execution: bool = False
    graph_level: str = DEFAULT_GRAPH_LEVEL
    enable_mem_arena: bool | None = None
    enable_mem_pattern: bool | None = None
    session_entries: dict[str, str] = field(default_factory=dict)
    run_entries: dict[str, str] = field(default_factory=dict)


def parse_bool(key: str, text: str) -> bool:
    """Same spellings as Triton's ``ParseBoolValue``."""
    value = text.strip().lower()
    if value in ("true", "on", "1"):
        return True
    if value in ("false", "off", "0"):
        return False
    raise ValueError(f"parameter '{key}': expected a boolean (true/false/1/0/on/off), got '{text}'")


def _string_parameters(config: Mapping[str, Any]) -> dict[str, str]:
    return {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}


def _int_parameter(params: Mapping[str, str], key: str) -> int | None:
    if key not in params:
        return None
    try:
        return int(params[key])
    except ValueError:
        raise ValueError(f"parameter '{key}': expected an integer, got '{params[key]}'") from None


def instance_count(config: Mapping[str, Any]) -> int:
    """Instances of this model in this server (one ORT session each)."""
    return max(1, sum(int(group.get("count", 1)) for group in config.get("instance_group", [])))


def available_cpus() -> int:
    """CPUs this process may run on (respects taskset/cgroup affinity, unlike ``os.cpu_count``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def parse_settings(config: Mapping[str, Any], cpus: int) -> OrtSettings:
    """Model config (Triton's JSON form) -> :class:`OrtSettings`. Raises ``ValueError`` on a bad value."""
    params = _string_parameters(config)
    intra = _int_parameter(params, "intra_op_thread_count")
    if intra is None:
        intra = max(1, cpus // instance_count(config))
    inter = _int_parameter(params, "inter_op_thread_count") or 0
    mode = _int_parameter(params, "execution_mode") or 0
    if mode not in (0, 1):
        raise ValueError(f"parameter 'execution_mode': expected 0 (sequential) or 1 (parallel), got {mode}")
    level = int(config.get("optimization", {}).get("graph", {}).get("level", 0))

    def optional_bool(key: str) -> bool | None:
        return parse_bool(key, params[key]) if key in params else None

    return OrtSettings(
        intra_op_threads=max(0, intra),
        inter_op_threads=max(0, inter),
        parallel_execution=mode == 1,
        graph_level=GRAPH_LEVELS.get(level, DEFAULT_GRAPH_LEVEL),
        enable_mem_arena=optional_bool("enable_mem_arena"),
        enable_mem_pattern=optional_bool("enable_mem_pattern"),
        session_entries={key: params[key] for key in SESSION_ENTRY_KEYS if key in params},
        run_entries={ARENA_SHRINKAGE_KEY: params[ARENA_SHRINKAGE_KEY]} if ARENA_SHRINKAGE_KEY in params else {},
    )


def session_options(settings: OrtSettings):
    """Build ``onnxruntime.SessionOptions`` (imported here so the parsing above needs no ORT)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = settings.inter_op_threads
    options.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if settings.parallel_execution else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, settings.graph_level)
    if settings.enable_mem_arena is not None:
        options.enable_cpu_mem_arena = settings.enable_mem_arena
    if settings.enable_mem_pattern is not None:
        options.enable_mem_pattern = settings.enable_mem_pattern
    for key, value in settings.session_entries.items():
        options.add_session_config_entry(key, value)
    options.log_severity_level = 3  # errors only: warnings go to the server log otherwise, once per instance
    return options


def run_options(settings: OrtSettings):
    """``onnxruntime.RunOptions`` carrying the run-level keys (e.g. arena shrinkage), or None."""
    if not settings.run_entries:
        return None
    import onnxruntime as ort

    options = ort.RunOptions()
    for key, value in settings.run_entries.items():
        options.add_run_config_entry(key, value)
    return options


def model_file(model_dir: str | Path, version: str | int, config: Mapping[str, Any]) -> Path:
    """``<model_dir>/<version>/<default_model_filename or model.onnx>``; a directory holds ``model.onnx``."""
    path = Path(model_dir) / str(version) / (config.get("default_model_filename") or "model.onnx")
    return path / "model.onnx" if path.is_dir() else path


def stub_model_file() -> Path | None:
    """The model file of the running Python-backend stub: its argv[1] (auto-complete gets no path)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None
    if len(argv) < 2 or not argv[1]:
        return None
    path = Path(os.fsdecode(argv[1]))
    return path / "model.onnx" if path.is_dir() else path


@dataclass(frozen=True)
class ModelTensor:
    """One input/output as ONNX Runtime reports it: ``shape`` items are ints, or str/None when dynamic."""

    name: str
    type: str
    shape: tuple[int | str | None, ...]

    @classmethod
    def from_node_arg(cls, arg) -> ModelTensor:
        return cls(arg.name, arg.type, tuple(arg.shape))

    @property
    def triton_type(self) -> str:
        return ORT_TO_TRITON.get(self.type, f"unsupported {self.type}")


def _dims(shape: Sequence[int | str | None]) -> list[int]:
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


def autocomplete_entries(tensors: Iterable[ModelTensor], batched: bool) -> list[dict[str, Any]]:
    """Config entries (``name``, ``data_type``, ``dims``) for tensors the config does not list.

    With batching the first model dimension is the batch and is left out of ``dims``, as Triton expects.
    """
    entries = []
    for tensor in tensors:
        dims = _dims(tensor.shape[1:] if batched else tensor.shape)
        entries.append({"name": tensor.name, "data_type": tensor.triton_type, "dims": dims})
    return entries


def check_against_model(
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    model_inputs: Sequence[ModelTensor],
    model_outputs: Sequence[ModelTensor],
    batched: bool,
) -> None:
    """Fail at load time, with every mismatch listed, rather than on the first request."""
    problems: list[str] = []
    by_name = {t.name: t for t in (*model_inputs, *model_outputs)}
    for kind, specs, available in (("input", inputs, model_inputs), ("output", outputs, model_outputs)):
        names = {t.name for t in available}
        for spec in specs:
            tensor = by_name.get(spec.name)
            if spec.name not in names:
                problems.append(f"config {kind} '{spec.name}' is not a model {kind} (model has {sorted(names)})")
                continue
            if tensor.triton_type != spec.data_type:
                problems.append(f"{kind} '{spec.name}': config says {spec.data_type}, model has {tensor.type}")
            rank = len(spec.dims) + (1 if batched else 0)
            if len(tensor.shape) != rank:
                problems.append(
                    f"{kind} '{spec.name}': config gives rank {rank} (dims {list(spec.dims)}"
                    f"{' plus batch' if batched else ''}), "
                    f"model has rank {len(tensor.shape)} {list(tensor.shape)}"
                )
    configured = {spec.name for spec in inputs}
    for tensor in model_inputs:
        if tensor.name not in configured:
            problems.append(f"model input '{tensor.name}' is missing from the config")
    if problems:
        raise ValueError("model config does not match the ONNX model: " + "; ".join(problems))
