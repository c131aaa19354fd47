"""Which ONNX Runtime execution providers the export, parity and benchmark tools run on.

CUDA first where this ``onnxruntime`` has it (the ``gpu`` extra installs ``onnxruntime-gpu``), else the CPU.
``ROPESERVE_ORT_PROVIDERS=CPUExecutionProvider`` (comma-separated, in order) overrides the choice, e.g. to
measure the CPU on a GPU host. A name this build does not have is an error here: ONNX Runtime itself only
warns and runs on what is left, so a benchmark would quietly measure the wrong device.

The ONNX models Triton serves do not come through here: Triton picks their provider from ``config.pbtxt``
(``KIND_GPU``: CUDA on the NGC image) and the embedded server's backend is CPU-only. The graphs a front model
runs itself in its process (the engine's step graphs, sentiment's windows) do: :func:`in_process_session`.
The CUDA path is not run on the machines this project is built and tested on (they have no GPU).
"""

from __future__ import annotations

import os
from pathlib import Path

import onnxruntime as ort

ENV_VAR = "ROPESERVE_ORT_PROVIDERS"
PREFERRED = ("CUDAExecutionProvider", "CPUExecutionProvider")


def execution_providers() -> list[str]:
    """The providers to pass to ``ort.InferenceSession``, most preferred first."""
    available = ort.get_available_providers()
    requested = [name.strip() for name in os.environ.get(ENV_VAR, "").split(",") if name.strip()]
    if not requested:
        return [name for name in PREFERRED if name in available]
    unknown = [name for name in requested if name not in available]
    if unknown:
        why = ", ".join(
            f"{name} ({'not in this onnxruntime build' if name in ort.get_all_providers() else 'no such provider'})"
            for name in unknown
        )
        raise ValueError(
            f"{ENV_VAR} asks for {why}; onnxruntime {ort.__version__} here has {', '.join(available)}"
            + ("; CUDA needs the gpu extra (pyproject.toml)" if "CUDAExecutionProvider" in unknown else "")
        )
    return requested


def inference_session(path: Path | str, options: ort.SessionOptions | None = None) -> ort.InferenceSession:
    """``ort.InferenceSession`` on :func:`execution_providers`."""
    return ort.InferenceSession(str(path), options, providers=execution_providers())


def in_process_session(path: Path | str, threads: int) -> ort.InferenceSession:
    """A session for a graph a front model runs itself: `threads` intra-op threads that do not spin (each
    instance is one caller; spinning would only take the core from the other instance)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return inference_session(path, options)
