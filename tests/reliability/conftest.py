"""Fixtures for the reliability suite: servers of their own, stopped at the end of each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from reliability_helpers import REPOSITORY

from serving.launcher.embedded import EmbeddedTriton, ServerOptions, free_ports


@pytest.fixture
def start_server(tmp_path_factory) -> Iterator[Callable[..., EmbeddedTriton]]:
    """`start_server(models, repository=..., **options)` → a started server of its own; all stopped at the end."""
    servers: list[EmbeddedTriton] = []

    def start(models: list[str], repository: Path = REPOSITORY, **overrides) -> EmbeddedTriton:
        http, grpc, metrics = free_ports(3)
        options = ServerOptions(
            model_repository=repository, http_port=http, grpc_port=grpc, metrics_port=metrics, models=models
        )
        log_file = tmp_path_factory.mktemp("triton-log") / "tritonserver.log"  # kept for a failing test's report
        server = EmbeddedTriton(options, **{"log_file": log_file, **overrides})
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.kill()
