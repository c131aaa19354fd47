"""The embedded Triton server and the Python-based ONNX Runtime backend, against a toy repository.

Real ``tritonserver`` processes on free ports, called through ``tritonclient.grpc`` and ``tritonclient.http``;
plus unit tests of the backend's batching and config helpers, which need no server.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from serving.launcher.backend_dir import build_backend_directory
from serving.launcher.embedded import (
    CONTROL_KEY_HEADER,
    EmbeddedTriton,
    PortInUseError,
    ServerError,
    ServerOptions,
    free_ports,
    process_group_members,
)
from serving.launcher.reaper import SHM_ROOT
from serving.launcher.repository import RepositoryError, require_servable
from serving.launcher.wheel import TritonWheel
from serving.ort_backend import batching, session_config

# --------------------------------------------------------------------------------------------------------
# Toy model repository
# --------------------------------------------------------------------------------------------------------

ONNX_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
{io}
instance_group [{{ kind: {kind} count: 1 }}]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
optimization {{ graph {{ level: 1 }} }}
dynamic_batching {{ max_queue_delay_microseconds: 5000 }}
"""

AFFINE_IO = """
input [{ name: "x" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [4] }, { name: "total" data_type: TYPE_FP32 dims: [1] }]
"""

SEQ_IO = """
input [{ name: "ids" data_type: TYPE_INT64 dims: [-1] }]
output [{ name: "doubled" data_type: TYPE_INT64 dims: [-1] }]
"""

PYTHON_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() + 10)]
            )
            for r in requests
        ]
"""

PYTHON_CONFIG = """
name: "toy_python"
backend: "python"
max_batch_size: 8
input [{ name: "x" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [4] }]
instance_group [{ kind: KIND_CPU count: 1 }]
"""


def _save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.checker.check_model(model)
    onnx.save(model, path)


def affine_onnx() -> onnx.ModelProto:
    """y = 2x + 1 and total = sum(x) over FP32 [batch, 4]."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "two"], ["x2"]),
            helper.make_node("Add", ["x2", "one"], ["y"]),
            helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=1),
        ],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, ["batch", 1]),
        ],
        [
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
            helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def seq_onnx() -> onnx.ModelProto:
    """doubled = 2 * ids over INT64 [batch, seq]: requests of different lengths cannot share a run."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["ids", "two"], ["doubled"])],
        "seq",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("doubled", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor("two", TensorProto.INT64, [], [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def build_toy_repository(root: Path) -> Path:
    """toy_onnx: config.pbtxt asks for a GPU, configs/cpu.pbtxt for the CPU (so loading proves the CPU
    config was used); toy_python has config.pbtxt only (the fallback); toy_seq has a variable dim;
    toy_autocomplete's config lists no tensors (the backend fills them in from the ONNX file)."""
    repo = root / "repo"
    _save(affine_onnx(), repo / "toy_onnx" / "1" / "model.onnx")
    (repo / "toy_onnx" / "config.pbtxt").write_text(ONNX_CONFIG.format(name="toy_onnx", io=AFFINE_IO, kind="KIND_GPU"))
    (repo / "toy_onnx" / "configs").mkdir()
    (repo / "toy_onnx" / "configs" / "cpu.pbtxt").write_text(
        ONNX_CONFIG.format(name="toy_onnx", io=AFFINE_IO, kind="KIND_CPU")
    )
    _save(seq_onnx(), repo / "toy_seq" / "1" / "model.onnx")
    (repo / "toy_seq" / "config.pbtxt").write_text(ONNX_CONFIG.format(name="toy_seq", io=SEQ_IO, kind="KIND_CPU"))
    _save(affine_onnx(), repo / "toy_autocomplete" / "1" / "model.onnx")
    (repo / "toy_autocomplete" / "config.pbtxt").write_text(
        'name: "toy_autocomplete"\nbackend: "onnxruntime"\nmax_batch_size: 4\n'
        "instance_group [{ kind: KIND_CPU count: 1 }]\n"
    )
    (repo / "toy_python" / "1").mkdir(parents=True)
    (repo / "toy_python" / "1" / "model.py").write_text(PYTHON_MODEL)
    (repo / "toy_python" / "config.pbtxt").write_text(PYTHON_CONFIG)
    return repo


def server_options(repo: Path, **overrides) -> ServerOptions:
    http, grpc, metrics = free_ports(3)
    defaults = dict(http_port=http, grpc_port=grpc, metrics_port=metrics, exit_timeout_s=5, ready_timeout_s=60)
    return ServerOptions(model_repository=repo, **{**defaults, **overrides})


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_toy_repository(tmp_path_factory.mktemp("toy"))


@pytest.fixture(scope="module")
def server(repo: Path):
    with EmbeddedTriton(server_options(repo)) as running:
        yield running


@pytest.fixture
def http(server: EmbeddedTriton):
    # Closed before the server stops: Triton waits for open HTTP connections on shutdown.
    client = httpclient.InferenceServerClient(server.http_address)
    yield client
    client.close()


@pytest.fixture
def grpc(server: EmbeddedTriton):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def _input(module, name: str, array: np.ndarray, datatype: str):
    tensor = module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def infer_affine(client, module, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    result = client.infer("toy_onnx", [_input(module, "x", x, "FP32")])
    return result.as_numpy("y"), result.as_numpy("total")


# --------------------------------------------------------------------------------------------------------
# Real server
# --------------------------------------------------------------------------------------------------------


def test_cpu_config_is_used_and_config_pbtxt_is_the_fallback(http) -> None:
    onnx_config = http.get_model_config("toy_onnx")
    assert onnx_config["instance_group"][0]["kind"] == "KIND_CPU"  # configs/cpu.pbtxt, not the GPU config
    assert onnx_config["backend"] == "onnxruntime"
    assert http.get_model_config("toy_python")["backend"] == "python"  # no configs/cpu.pbtxt: config.pbtxt
    assert http.is_model_ready("toy_seq")


def test_grpc_and_http_infer(http, grpc) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for client, module in ((grpc, grpcclient), (http, httpclient)):
        y, total = infer_affine(client, module, x)
        np.testing.assert_allclose(y, x * 2 + 1)
        np.testing.assert_allclose(total, x.sum(axis=1, keepdims=True))
        result = client.infer("toy_python", [_input(module, "x", x, "FP32")])
        np.testing.assert_allclose(result.as_numpy("y"), x + 10)


def test_autocomplete_fills_tensors_from_the_onnx_file(http) -> None:
    config = http.get_model_config("toy_autocomplete")
    inputs = [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config["input"]]
    assert inputs == [("x", "TYPE_FP32", [4])]
    assert {t["name"] for t in config["output"]} == {"y", "total"}
    x = np.ones((3, 4), np.float32)
    result = http.infer("toy_autocomplete", [_input(httpclient, "x", x, "FP32")])
    np.testing.assert_allclose(result.as_numpy("y"), x * 2 + 1)


def test_concurrent_requests_get_their_own_answers(server: EmbeddedTriton, http) -> None:
    before = http.get_inference_statistics("toy_onnx")["model_stats"][0]
    threads, rounds = 8, 6
    barrier = threading.Barrier(threads)

    def worker(seed: int) -> int:
        rng = np.random.default_rng(seed)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            barrier.wait()
            for _ in range(rounds):
                x = rng.standard_normal((int(rng.integers(1, 4)), 4)).astype(np.float32)
                y, total = infer_affine(client, grpcclient, x)
                np.testing.assert_allclose(y, x * 2 + 1, rtol=1e-6)
                np.testing.assert_allclose(total, x.sum(axis=1, keepdims=True), rtol=1e-5)
                ids = rng.integers(0, 1000, (1, int(rng.integers(2, 6))))  # lengths differ between requests
                doubled = client.infer("toy_seq", [_input(grpcclient, "ids", ids, "INT64")]).as_numpy("doubled")
                np.testing.assert_array_equal(doubled, ids * 2)
        finally:
            client.close()
        return rounds

    with ThreadPoolExecutor(threads) as pool:
        assert sum(pool.map(worker, range(threads))) == threads * rounds

    after = http.get_inference_statistics("toy_onnx")["model_stats"][0]
    requests = int(after["inference_stats"]["success"]["count"]) - int(before["inference_stats"]["success"]["count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert requests == threads * rounds
    assert executions < requests, "the dynamic batcher never merged requests"


def test_wrong_dtype_names_the_input_and_the_server_keeps_serving(http, grpc) -> None:
    with pytest.raises(InferenceServerException, match="'x'") as info:
        http.infer("toy_onnx", [_input(httpclient, "x", np.ones((1, 4), np.int32), "INT32")])
    assert "FP32" in str(info.value)
    with pytest.raises(InferenceServerException, match="x"):
        grpc.infer("toy_onnx", [_input(grpcclient, "x", np.ones((1, 4), np.float64), "FP64")])
    y, _ = infer_affine(grpc, grpcclient, np.zeros((1, 4), np.float32))
    np.testing.assert_allclose(y, np.ones((1, 4)))


def test_missing_input_and_wrong_shape_name_the_input(http, grpc) -> None:
    with pytest.raises(InferenceServerException, match="'x'"):
        http.infer("toy_onnx", [])
    with pytest.raises(InferenceServerException, match="'x'"):
        grpc.infer("toy_onnx", [_input(grpcclient, "x", np.ones((1, 5), np.float32), "FP32")])
    assert http.is_server_ready()


def test_metrics_endpoint_serves_latency_summaries(server: EmbeddedTriton, grpc) -> None:
    import urllib.request

    infer_affine(grpc, grpcclient, np.ones((1, 4), np.float32))
    with urllib.request.urlopen(server.metrics_url, timeout=5) as response:
        text = response.read().decode()
    assert 'nv_inference_request_success{model="toy_onnx"' in text
    assert "nv_inference_request_summary_us" in text  # --metrics-config=summary_latencies=true


@pytest.mark.server
def test_stop_leaves_no_process_and_no_shm_and_guards_model_control(repo: Path) -> None:
    """A second server (explicit mode, model control on): only the listed model loads; loading another needs
    the key; after stop() neither the server nor its stubs nor its /dev/shm segments remain."""
    server = EmbeddedTriton(server_options(repo, models=["toy_python"], allow_model_control=True)).start()
    try:
        client = httpclient.InferenceServerClient(server.http_address)
        try:
            assert client.is_model_ready("toy_python") and not client.is_model_ready("toy_onnx")
            with pytest.raises(InferenceServerException, match="restricted"):
                client.load_model("toy_onnx")
            client.load_model("toy_onnx", headers=server.control_headers("http"))
            infer_affine(client, httpclient, np.ones((1, 4), np.float32))
            # The key is nowhere another local user can read it: not on any command line of the server's
            # processes (Triton has it from a placeholder: serving/launcher/secret_args.py), nor in their environment
            # blocks (the preload library wipes it), nor in the log.
            readable = b""
            for pid in process_group_members(server.pid):
                for name in ("cmdline", "environ"):
                    with contextlib.suppress(OSError):
                        readable += Path(f"/proc/{pid}/{name}").read_bytes()
            assert b"--ropeserve-secret-argument=" in Path(f"/proc/{server.pid}/cmdline").read_bytes()
            assert server.control_key.encode() not in readable
            assert server.control_key not in server.log_tail(2000)
        finally:
            client.close()
        with grpcclient.InferenceServerClient(server.grpc_url) as grpc_client:
            with pytest.raises(InferenceServerException, match="restricted"):
                grpc_client.unload_model("toy_onnx")
            grpc_client.unload_model("toy_onnx", headers=server.control_headers("grpc"))
        processes = process_group_members(server.pid)
        segments = list(SHM_ROOT.glob(f"{server.shm_prefix}*"))
        assert len(processes) >= 3 and segments  # server + two stubs, with their shm
    finally:
        started = time.monotonic()
        returncode = server.stop()
    assert returncode == 0
    assert time.monotonic() - started < 15
    assert process_group_members(server.pid) == []
    assert list(SHM_ROOT.glob(f"{server.shm_prefix}*")) == []
    assert "successfully unloaded" in server.log_tail(200)


def test_busy_port_is_a_clear_error(repo: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        options = server_options(repo)
        options.grpc_port = port
        with pytest.raises(PortInUseError, match=f"grpc port {port}"):
            EmbeddedTriton(options).start()


@pytest.mark.server
def test_model_that_fails_to_load_is_reported_quickly(tmp_path: Path) -> None:
    repo = build_toy_repository(tmp_path)
    (repo / "toy_seq" / "1" / "model.onnx").write_bytes(b"this is not an onnx file")
    server = EmbeddedTriton(server_options(repo, models=["toy_seq", "toy_python"]))
    started = time.monotonic()
    with pytest.raises(ServerError, match="toy_seq"):
        server.start()
    assert time.monotonic() - started < 30
    assert not server.is_alive
    assert process_group_members(server.pid) == []


def test_missing_model_file_is_refused_before_starting(tmp_path: Path) -> None:
    repo = build_toy_repository(tmp_path)
    (repo / "toy_seq" / "1" / "model.onnx").unlink()
    with pytest.raises(RepositoryError, match=r"toy_seq.*model\.onnx is missing"):
        require_servable(repo, None, "cpu")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RepositoryError, match="holds no models"):
        require_servable(empty)
    require_servable(repo, ["toy_onnx", "toy_python"], "cpu")  # the others are fine


def test_config_that_does_not_parse_is_refused_before_starting(tmp_path: Path) -> None:
    repo = build_toy_repository(tmp_path)
    config = repo / "toy_onnx" / "configs" / "cpu.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_size: eight"))
    with pytest.raises(RepositoryError) as refused:
        require_servable(repo, None, "cpu")
    problems = str(refused.value).splitlines()[1:]
    assert len(problems) == 1
    assert problems[0].strip().startswith(f"model 'toy_onnx': {config} does not parse: 4:17 : ")
    assert "eight" in problems[0]
    require_servable(repo, ["toy_onnx"])  # without a config name Triton reads config.pbtxt, which parses


def test_command_line_flags(tmp_path: Path) -> None:
    options = ServerOptions(model_repository=tmp_path, models=["a", "b"], extra_args=["--log-info=false"])
    args = options.command_args(Path("/b"), Path("/c"), "pfx_", "secret")
    assert "--model-config-name=cpu" in args and "--http-address=127.0.0.1" in args
    assert "--backend-config=python,shm-region-prefix-name=pfx_" in args
    assert ["--load-model=a", "--load-model=b"] == [a for a in args if a.startswith("--load-model")]
    assert f"--grpc-restricted-protocol=model-repository:{CONTROL_KEY_HEADER}=secret" in args
    assert args[-1] == "--log-info=false"
    default = ServerOptions(model_repository=tmp_path).command_args(Path("/b"), Path("/c"), "p_", "k")
    # Always explicit mode with the repository API locked by the launcher's own key (the stub watchdog uses it).
    assert "--model-control-mode=explicit" in default and "--load-model=*" in default
    assert f"--http-restricted-api=model-repository:{CONTROL_KEY_HEADER}=k" in default


# --------------------------------------------------------------------------------------------------------
# Backend helpers, no server
# --------------------------------------------------------------------------------------------------------

X = batching.TensorSpec("x", "TYPE_FP32", (-1, 4))
MASK = batching.TensorSpec("mask", "TYPE_INT64", (-1,), optional=True)


def test_plan_groups_equal_shapes_and_splits_back() -> None:
    requests = [
        {"x": np.full((1, 3, 4), i, np.float32)} if i != 2 else {"x": np.full((2, 5, 4), i, np.float32)}
        for i in range(4)
    ]
    groups, errors = batching.plan_batches(requests, [X], batched=True)
    assert errors == {}
    assert [g.indices for g in groups] == [[0, 1, 3], [2]]
    feed = groups[0].feed()["x"]
    assert feed.shape == (3, 3, 4) and list(feed[:, 0, 0]) == [0, 1, 3]
    parts = batching.split_outputs({"y": feed * 2}, groups[0].batch_sizes)
    for index, part in zip(groups[0].indices, parts, strict=True):
        np.testing.assert_array_equal(part["y"], requests[index]["x"] * 2)
    assert groups[1].feed()["x"] is requests[2]["x"]  # a lone request is not copied


def test_invalid_requests_get_errors_and_the_others_still_run() -> None:
    good = {"x": np.zeros((1, 2, 4), np.float32)}
    requests = [
        good,
        {},
        {"x": np.zeros((1, 2, 4), np.float64)},
        {"x": np.zeros((2, 4), np.float32)},
        {"x": np.zeros((1, 2, 5), np.float32)},
        {"x": np.zeros((2, 2, 4), np.float32), "mask": np.zeros((1, 2), np.int64)},
        good,
    ]
    groups, errors = batching.plan_batches(requests, [X, MASK], batched=True)
    assert [g.indices for g in groups] == [[0, 6]]
    assert errors[1].startswith("missing input 'x'")
    assert "input 'x' has dtype float64, expected TYPE_FP32" in errors[2]
    assert "expected rank 3" in errors[3]
    assert "dimension 2 must be 4" in errors[4]
    assert "input 'mask' has batch size 1" in errors[5]


def test_optional_inputs_split_groups_and_unbatched_models_run_alone() -> None:
    with_mask = {"x": np.zeros((1, 2, 4), np.float32), "mask": np.ones((1, 2), np.int64)}
    without = {"x": np.zeros((1, 2, 4), np.float32)}
    groups, _ = batching.plan_batches([with_mask, without, with_mask], [X, MASK], batched=True)
    assert [g.indices for g in groups] == [[0, 2], [1]]
    spec = batching.TensorSpec("x", "TYPE_FP32", (2, 4))
    groups, _ = batching.plan_batches([{"x": np.zeros((2, 4), np.float32)}] * 2, [spec], batched=False)
    assert [g.indices for g in groups] == [[0], [1]]


def test_split_rejects_outputs_without_the_batch_dimension() -> None:
    with pytest.raises(ValueError, match="output 'y'"):
        batching.split_outputs({"y": np.zeros((3, 1))}, [1, 1])


def test_string_inputs_become_str_for_onnxruntime() -> None:
    spec = batching.TensorSpec("text", "TYPE_STRING", (1,))
    feed = batching.validate_request({"text": np.array([[b"\xe6\x88\x91"], [b"b"]], dtype=object)}, [spec], True)
    assert feed["text"].tolist() == [["我"], ["b"]]


def test_session_settings_use_the_native_backend_keys() -> None:
    config = {
        "instance_group": [{"kind": "KIND_CPU", "count": 2}],
        "optimization": {"graph": {"level": -1}},
        "parameters": {
            "inter_op_thread_count": {"string_value": "2"},
            "execution_mode": {"string_value": "1"},
            "enable_mem_arena": {"string_value": "false"},
            "memory.enable_memory_arena_shrinkage": {"string_value": "cpu:0"},
        },
    }
    settings = session_config.parse_settings(config, cpus=4)
    assert settings.intra_op_threads == 2  # 4 CPUs split between 2 instances
    assert (settings.inter_op_threads, settings.parallel_execution) == (2, True)
    assert settings.graph_level == "ORT_ENABLE_BASIC" and settings.enable_mem_arena is False
    assert settings.run_entries == {"memory.enable_memory_arena_shrinkage": "cpu:0"}
    options = session_config.session_options(settings)
    assert options.intra_op_num_threads == 2 and options.enable_cpu_mem_arena is False
    assert session_config.parse_settings({}, cpus=2).graph_level == "ORT_ENABLE_ALL"
    explicit = {"parameters": {"intra_op_thread_count": {"string_value": "0"}}}
    assert session_config.parse_settings(explicit, cpus=8).intra_op_threads == 0  # 0 = ORT decides
    with pytest.raises(ValueError, match="execution_mode"):
        session_config.parse_settings({"parameters": {"execution_mode": {"string_value": "2"}}}, cpus=1)
    with pytest.raises(ValueError, match="enable_mem_pattern"):
        session_config.parse_settings({"parameters": {"enable_mem_pattern": {"string_value": "maybe"}}}, cpus=1)


def test_config_is_checked_against_the_model() -> None:
    model_in = [session_config.ModelTensor("x", "tensor(float)", ("batch", 4))]
    model_out = [session_config.ModelTensor("y", "tensor(float)", ("batch", 4))]
    y = batching.TensorSpec("y", "TYPE_FP32", (4,))
    session_config.check_against_model([batching.TensorSpec("x", "TYPE_FP32", (4,))], [y], model_in, model_out, True)
    with pytest.raises(ValueError) as info:
        session_config.check_against_model(
            [batching.TensorSpec("x", "TYPE_FP16", (4, 1))], [batching.TensorSpec("z", "TYPE_FP32", (4,))],
            model_in, model_out, True,
        )  # fmt: skip
    message = str(info.value)
    assert "config says TYPE_FP16" in message and "rank 3" in message and "output 'z'" in message
    entries = session_config.autocomplete_entries(model_in, batched=True)
    assert json.dumps(entries) == json.dumps([{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}])


def test_object_storage_repositories_and_native_installs_change_only_their_flags(tmp_path: Path) -> None:
    remote = ServerOptions(model_repository="s3://bucket/ropeserve/model_repository")
    args = remote.command_args(Path("/opt/tritonserver/backends"), None, "p_", "k")
    assert remote.remote_repository and "--model-repository=s3://bucket/ropeserve/model_repository" in args
    assert not any(arg.startswith("--cache-directory") for arg in args)  # NGC's binary finds its own caches
    local = ServerOptions(model_repository=tmp_path).command_args(Path("/b"), Path("/c"), "p_", "k")
    assert f"--model-repository={tmp_path.resolve()}" in local and "--cache-directory=/c" in local


@pytest.mark.server
def test_liveness_through_the_guard_sees_a_dead_server(repo: Path) -> None:
    """Triton's /v2/health/live cannot answer for a dead Triton; the launcher's guard answers 503 and says why."""
    server = EmbeddedTriton(server_options(repo, models=["toy_python"])).start()
    try:
        assert urllib.request.urlopen(f"{server.http_url}/v2/health/live", timeout=10).status == 200
        server.process.kill()
        server.process.wait()
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(f"{server.http_url}/v2/health/live", timeout=10)
        assert answer.value.code == 503
        assert "tritonserver is not running" in answer.value.read().decode()
    finally:
        server.kill()


@pytest.mark.server
def test_a_tritonserver_binary_of_your_choice_runs_with_its_own_backends(repo: Path, tmp_path: Path) -> None:
    """`--tritonserver` (what the NGC image uses): the launcher runs that binary with the backends beside it,
    building nothing. Here the wheel's binary stands in, with a backends folder laid out in advance."""
    wheel = TritonWheel.locate()
    backends = build_backend_directory(tmp_path / "backends", wheel)
    options = server_options(
        repo, models=["toy_onnx"], tritonserver=wheel.binary, backend_directory=backends, env=wheel.environment()
    )
    with EmbeddedTriton(options) as server:
        client = httpclient.InferenceServerClient(server.http_address)
        try:
            assert client.is_model_ready("toy_onnx")
        finally:
            client.close()
        command = Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")
    assert f"--backend-directory={backends}".encode() in command
    assert not any(arg.startswith(b"--cache-directory") for arg in command)
