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
