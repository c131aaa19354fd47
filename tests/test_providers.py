"""Which execution provider runs each ONNX graph.

- The export, parity and benchmark tools (serving/providers.py): CUDA first where onnxruntime-gpu has it, the CPU
  otherwise (this machine: no GPU, so only the fallback and the override really run here); ROPESERVE_ORT_PROVIDERS
  overrides, and a provider this build lacks is a clear error rather than ONNX Runtime's warning.
- The served models on the NGC image (model_repository/*/config.pbtxt): the CUDA execution provider, with the same
  inputs and outputs as the CPU configs, and a TensorRT accelerator only on a graph TensorRT's parser could take.
  No GPU config is loaded by a server here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper
from tritonclient.grpc import model_config_pb2

from serving.providers import ENV_VAR, execution_providers, inference_session

ROOT = Path(__file__).resolve().parents[1]
REPOSITORY = ROOT / "model_repository"
CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


@pytest.fixture
def tiny_model(tmp_path) -> Path:
    """y = x + 1, small enough to build a real session on any provider."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"])], "tiny", [x], [y], [one])
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), str(path))
    return path


@pytest.fixture
def gpu_host(monkeypatch):
    """What onnxruntime-gpu reports on a CUDA machine (the provider list only; nothing runs on it)."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])


def test_this_machine_falls_back_to_the_cpu(monkeypatch, tiny_model):
    monkeypatch.delenv(ENV_VAR, raising=False)
    expected = [CUDA, CPU] if CUDA in ort.get_available_providers() else [CPU]
    assert execution_providers() == expected
    session = inference_session(tiny_model)
    assert session.get_providers()[0] == expected[0]
    np.testing.assert_allclose(session.run(None, {"x": np.zeros(2, np.float32)})[0], [1.0, 1.0])


def test_a_cuda_host_gets_cuda_first_and_the_cpu_behind_it(monkeypatch, gpu_host):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert execution_providers() == [CUDA, CPU]


def test_the_environment_overrides_the_choice(monkeypatch, gpu_host, tiny_model):
    monkeypatch.setenv(ENV_VAR, f" {CPU} ")
    assert execution_providers() == [CPU]  # e.g. to measure the CPU on a GPU host
    monkeypatch.setenv(ENV_VAR, f"{CPU},{CUDA}")
    assert execution_providers() == [CPU, CUDA]  # the order given is the order used


def test_a_provider_this_build_lacks_is_an_error_naming_it(monkeypatch, tiny_model):
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CPU])
    monkeypatch.setenv(ENV_VAR, f"{CUDA},{CPU}")
    with pytest.raises(ValueError, match=rf"{ENV_VAR} asks for {CUDA} \(not in this onnxruntime build\).*gpu extra"):
        inference_session(tiny_model)
    monkeypatch.setenv(ENV_VAR, "CudaProvider")
    with pytest.raises(ValueError, match=r"CudaProvider \(no such provider\).* has CPUExecutionProvider"):
        execution_providers()


def test_the_benchmark_sessions_go_through_the_choice(monkeypatch, tiny_model):
    from benchmarks.onnx_variants import session

    monkeypatch.setenv(ENV_VAR, CPU)
    assert session(tiny_model, threads=1).get_providers() == [CPU]
    monkeypatch.setenv(ENV_VAR, "NoSuchExecutionProvider")
    with pytest.raises(ValueError, match="NoSuchExecutionProvider"):
        session(tiny_model, threads=1)


def test_no_tool_pins_its_own_providers():
    """Every session in export/ and benchmarks/ is built by serving/providers.py (serving/ has its own backend)."""
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("export", "benchmarks")
        for path in (ROOT / folder).rglob("*.py")
        if "InferenceSession(" in path.read_text() and path.name != "providers.py"
    ]
    assert not offenders


def model_config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


ONNX_MODELS = sorted(p.parent.parent.name for p in REPOSITORY.glob("*/configs/cpu.pbtxt"))


@pytest.mark.parametrize("model", ONNX_MODELS)
def test_gpu_config_is_the_cpu_config_on_cuda(model):
    gpu, cpu = (model_config(REPOSITORY / model / name) for name in ("config.pbtxt", "configs/cpu.pbtxt"))
    assert [g.kind for g in gpu.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_GPU]
    for field in ("name", "platform", "max_batch_size", "input", "output", "dynamic_batching"):
        assert getattr(gpu, field) == getattr(cpu, field), field


def contrib_ops(path: Path) -> set[str]:
    """com.microsoft op types anywhere in the graph, BeamSearch's subgraphs included."""
    found, graphs = set(), [onnx.load(str(path), load_external_data=False).graph]
    while graphs:
        for node in graphs.pop().node:
            if node.domain == "com.microsoft":
                found.add(node.op_type)
            graphs += [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
    return found


@pytest.mark.parametrize("model", ONNX_MODELS)
def test_tensorrt_only_for_a_graph_its_parser_takes(model):
    """TensorRT's ONNX parser does not take com.microsoft ops: ORT would split such a graph between TensorRT and
    CUDA at every attention node. Every graph exported here has them, so no GPU config asks for TensorRT."""
    path = REPOSITORY / model / "1" / "model.onnx"
    assert path.is_file(), f"{path} is missing: run `make repository` (or `make test`, which builds it)"
    accelerators = model_config(REPOSITORY / model / "config.pbtxt").optimization.execution_accelerators
    tensorrt = any(a.name == "tensorrt" for a in accelerators.gpu_execution_accelerator)
    ops = contrib_ops(path)
    assert not (tensorrt and ops), f"{model} asks for TensorRT but its graph has com.microsoft {sorted(ops)}"
