"""Helpers for the reliability suite: raw requests, process facts, repository copies.

These tests talk to Triton with the bare `tritonclient` (not our SDK, which refuses bad input before sending), so
the server itself is what gets tested.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from serving.launcher.embedded import EmbeddedTriton
from serving.launcher.processes import process_group_members
from serving.launcher.watchdog import find_stubs

REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"
PUBLIC_MODELS = ("sentiment", "translate", "summarize")
OUTPUT = {"sentiment": "LABEL", "translate": "TRANSLATION", "summarize": "SUMMARY"}
CLIENTS = {"grpc": grpcclient, "http": httpclient}


def text_input(module, texts: list, name: str = "TEXT"):
    """A BYTES [N, 1] input from str or raw bytes items."""
    data = np.array([[t.encode("utf-8") if isinstance(t, str) else t] for t in texts], dtype=np.object_)
    tensor = module.InferInput(name, list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    return tensor


def int_input(module, name: str, value: int, rows: int):
    tensor = module.InferInput(name, [rows, 1], "INT32")
    tensor.set_data_from_numpy(np.full((rows, 1), value, dtype=np.int32))
    return tensor


def connect(server: EmbeddedTriton, protocol: str, timeout_s: float = 60.0):
    if protocol == "grpc":
        return grpcclient.InferenceServerClient(server.grpc_url)
    return httpclient.InferenceServerClient(server.http_address, network_timeout=timeout_s, connection_timeout=10)


def infer(client, model: str, inputs: list, timeout_s: float = 60.0):
    """One request; gRPC gets a client-side deadline so a hang fails the test instead of stalling it."""
    if isinstance(client, grpcclient.InferenceServerClient):
        return client.infer(model, inputs, client_timeout=timeout_s)
    return client.infer(model, inputs)


def outcome(client, model: str, inputs: list, timeout_s: float = 60.0) -> str:
    """ "ok", or the error the request got as "status: message"."""
    try:
        infer(client, model, inputs, timeout_s)
    except InferenceServerException as err:
        return f"{err.status()}: {err.message()}"
    return "ok"


def stub_pids(server: EmbeddedTriton) -> dict[int, str]:
    """pid → model of every Python-backend stub of the server."""
    return {stub.pid: stub.model for stub in find_stubs(process_group_members(server.pid))}


def copy_models(target: Path, models: list[str]) -> Path:
    """A repository holding `models` from model_repository/, ONNX files linked rather than copied."""
    target.mkdir(parents=True, exist_ok=True)
    for model in models:
        shutil.copytree(REPOSITORY / model, target / model, symlinks=True, copy_function=_link_large)
    return target


def _link_large(src: str, dst: str) -> None:
    if src.endswith(".onnx"):
        Path(dst).symlink_to(Path(src).resolve())
    else:
        shutil.copy2(src, dst)
