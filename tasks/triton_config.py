"""Triton model configs generated from the task definitions, and the check that the committed ones match.

Each front model gets ``config.pbtxt`` (Python backend, KIND_CPU: the same on every host). Each ONNX model
gets ``config.pbtxt`` for the NGC image (native onnxruntime backend on the GPU) and ``configs/cpu.pbtxt``,
which ``--model-config-name=cpu`` selects here. The files are committed, so the repository serves as it is,
and `python -m tasks check` (a test runs it) fails when they drift from the definitions.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from .definition import TEXT_INPUT, Endpoint, OnnxModel, Task, Tensor

DATA_TYPES = {"string": pb.TYPE_STRING, "int32": pb.TYPE_INT32, "int64": pb.TYPE_INT64, "fp32": pb.TYPE_FP32}
CPU_CONFIG = "cpu"
THREADS_PARAMETER = "intra_op_thread_count"


def _header(task: Task, about: str, variant: str) -> str:
    lines = [
        f"Generated from tasks/{task.source.name} by `python -m tasks generate`: edit that file, not this one.",
        *textwrap.dedent(about).strip().splitlines(),
        *textwrap.wrap(variant, 116),
    ]
    return "".join(f"# {line}".rstrip() + "\n" for line in lines)


def _add_tensor(field: pb.ModelInput | pb.ModelOutput, tensor: Tensor) -> None:
    field.name = tensor.name
    field.data_type = DATA_TYPES[tensor.type]
    field.dims.extend(tensor.dims)


def front_config(task: Task, endpoint: Endpoint) -> str:
    config = pb.ModelConfig(name=endpoint.name, backend="python", max_batch_size=endpoint.max_batch_size)
    _add_tensor(config.input.add(), Tensor(TEXT_INPUT, "string"))
    options = task.options if endpoint.reads_options else ()
    for option in options:
        entry = config.input.add()
        _add_tensor(entry, Tensor(option.input, option.type))  # INT32 or (a string option) BYTES, dims [1]
        entry.optional = True
    for tensor in endpoint.outputs:
        _add_tensor(config.output.add(), tensor)
    policy = config.dynamic_batching.default_queue_policy
    policy.max_queue_size = endpoint.queue_size
    policy.timeout_action = pb.ModelQueuePolicy.REJECT
    policy.default_timeout_microseconds = round(endpoint.queue_timeout_s * 1_000_000)
    config.instance_group.add(count=endpoint.instances, kind=pb.ModelInstanceGroup.KIND_CPU)
    if endpoint.decoupled:
        config.model_transaction_policy.decoupled = True
    if endpoint.threads:
        config.parameters[THREADS_PARAMETER].string_value = str(endpoint.threads)
    if endpoint.precision != "fp32":
        config.parameters["precision"].string_value = endpoint.precision
    names = ", ".join(o.input for o in options)
    optional = f" and optional {names} ({_limits(task)}: tasks/{task.source.name})" if names else ""
    if not endpoint.reads_options:
        optional = " (one chat request as JSON: serving/text/chat_request.py)"
    variant = (
        f"Front model (Python backend): TEXT{optional}. At most "
        f"{endpoint.queue_size} requests wait; a full queue, or a request that waited {endpoint.queue_timeout_s:g} s, "
        "is refused at once (REJECT: UNAVAILABLE, HTTP 503)."
        + (" Decoupled: a stream of responses per request, the last flagged final." if endpoint.decoupled else "")
    )
    return _header(task, endpoint.about, variant) + _text(config)


def _limits(task: Task) -> str:
    """What the definition says about the options: "defaults and ranges", "defaults and choices" or both."""
    words = ["defaults"]
    words += ["ranges"] if any(not o.choices for o in task.options) else []
    words += ["choices"] if any(o.choices for o in task.options) else []
    return ", ".join(words[:-1]) + " and " + words[-1]


def onnx_config(task: Task, model: OnnxModel, variant: str | None) -> str:
    """``variant`` None: the NGC image's config (GPU); ``"cpu"``: the CPU variant."""
    config = pb.ModelConfig(name=model.name, platform="onnxruntime_onnx", max_batch_size=model.max_batch_size)
    for tensor in model.inputs:
        _add_tensor(config.input.add(), tensor)
    for tensor in model.outputs:
        _add_tensor(config.output.add(), tensor)
    if model.dynamic_batching:
        config.dynamic_batching.SetInParent()
    if variant == CPU_CONFIG:
        config.instance_group.add(count=model.cpu_instances, kind=pb.ModelInstanceGroup.KIND_CPU)
        config.parameters[THREADS_PARAMETER].string_value = str(model.threads)
        note = f"CPU variant, selected with --model-config-name={CPU_CONFIG} (as the launcher does without a GPU)."
    else:
        config.instance_group.add(count=model.gpu_instances, kind=pb.ModelInstanceGroup.KIND_GPU)
        note = "GPU config for the NGC image: native onnxruntime backend on the CUDA execution provider."
    notes = [f"{t.name}: {t.note}" for t in (*model.inputs, *model.outputs) if t.note]
    return _header(task, "\n".join([textwrap.dedent(model.about).strip(), *notes]), note) + _text(config)


def _text(config: pb.ModelConfig) -> str:
    return str(text_format.MessageToString(config, use_short_repeated_primitives=True))


def config_files(task: Task) -> dict[Path, str]:
    """Relative path in the model repository → generated text, for every model of the task."""
    files = {}
    for endpoint in task.endpoints():
        files[Path(endpoint.name) / "config.pbtxt"] = front_config(task, endpoint)
    for model in task.models():
        files[Path(model.name) / "config.pbtxt"] = onnx_config(task, model, None)
        files[Path(model.name) / "configs" / f"{CPU_CONFIG}.pbtxt"] = onnx_config(task, model, CPU_CONFIG)
    return files


def write(task: Task, repository: Path) -> list[Path]:
    """Write the task's configs into ``repository``; returns the files whose text changed."""
    changed = []
    for relative, text in config_files(task).items():
        path = repository / relative
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def drift(task: Task, repository: Path) -> list[str]:
    """A sentence per config file in ``repository`` that differs from what the definition generates."""
    problems = []
    for relative, text in config_files(task).items():
        path = repository / relative
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path} differs from tasks/{task.source.name}")
    return problems
