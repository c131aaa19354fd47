"""Shared fixtures: one real Triton server on the built model repository, for the whole session."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.embedded import EmbeddedTriton, ServerOptions, free_ports

ROOT = Path(__file__).resolve().parents[1]
REPOSITORY = ROOT / "model_repository"


@pytest.fixture(scope="session")
def triton():
    """The real embedded tritonserver serving model_repository/ (built by `make repository`)."""
    for model in ("sentiment_encoder", "translate_generator", "summarize_generator"):
        onnx = REPOSITORY / model / "1" / "model.onnx"
        assert onnx.exists(), f"{onnx} is missing: run `make repository` (or `make test`, which builds it)"
    http, grpc, metrics = free_ports(3)
    server = EmbeddedTriton(
        ServerOptions(model_repository=REPOSITORY, http_port=http, grpc_port=grpc, metrics_port=metrics)
    )
    server.start()
    yield server
    server.stop()


NGC_ORT_PYTHON = ROOT / ".cache" / "ort-ngc" / "bin" / "python"


@pytest.fixture
def ngc_ort(tmp_path):
    """Run an ONNX file in ONNX Runtime 1.19.2 (the NGC 24.10 image's version, in .cache/ort-ngc).

    Returns `run(model_path, feeds, outputs) -> list[np.ndarray]`; it asserts the version on the way.
    """
    import subprocess

    import numpy as np

    assert NGC_ORT_PYTHON.exists(), "run `make test` (it installs onnxruntime 1.19.2 into .cache/ort-ngc)"

    def run(model_path, feeds: dict, outputs: list[str]) -> list:
        np.savez(tmp_path / "feeds.npz", **feeds)
        script = (
            "import sys, numpy as np, onnxruntime as ort\n"
            "assert ort.__version__ == '1.19.2', ort.__version__\n"
            "s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
            "feeds = dict(np.load(sys.argv[2]))\n"
            "np.savez(sys.argv[3], *s.run(sys.argv[4].split(','), feeds))\n"
        )
        args = [str(model_path), str(tmp_path / "feeds.npz"), str(tmp_path / "out.npz"), ",".join(outputs)]
        result = subprocess.run([str(NGC_ORT_PYTHON), "-c", script, *args], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        saved = np.load(tmp_path / "out.npz")
        return [saved[f"arr_{i}"] for i in range(len(outputs))]

    return run
