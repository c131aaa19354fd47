"""The only place that knows how gRPC and HTTP differ in tritonclient.

Both protocols come in a blocking and an asyncio flavour with the same method names; what differs is the
module to import, the default port, and where the client-side timeout goes (per call for gRPC, per connection
for HTTP). Modules are imported on first use so a gRPC user never loads gevent, and the CLI starts faster.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Transport:
    """How to open a tritonclient client for one protocol and pass it our timeout."""

    name: str
    default_url: str
    sync_module: str
    async_module: str
    sync_timeout_kwargs: tuple[str, ...]  # constructor keywords that take the timeout in seconds
    async_timeout_kwargs: tuple[str, ...]
    timeout_per_call: str | None  # keyword of infer()/is_server_ready() that takes seconds, if any

    @functools.cache  # noqa: B019 - a handful of frozen instances; every request asks
    def module(self, asynchronous: bool) -> ModuleType:
        return importlib.import_module(self.async_module if asynchronous else self.sync_module)

    def open(self, url: str, timeout_s: float, asynchronous: bool) -> Any:
        """A tritonclient InferenceServerClient for `url` (no network traffic happens yet)."""
        keywords = self.async_timeout_kwargs if asynchronous else self.sync_timeout_kwargs
        kwargs = {keyword: timeout_s for keyword in keywords}
        return self.module(asynchronous).InferenceServerClient(url, **kwargs)

    def call_kwargs(self, timeout_s: float) -> dict[str, float]:
        """Keyword arguments every infer()/is_server_ready() call needs to honour the timeout."""
        return {self.timeout_per_call: timeout_s} if self.timeout_per_call else {}


TRANSPORTS: dict[str, Transport] = {
    "grpc": Transport(
        name="grpc",
        default_url="127.0.0.1:8001",
        sync_module="tritonclient.grpc",
        async_module="tritonclient.grpc.aio",
        sync_timeout_kwargs=(),
        async_timeout_kwargs=(),
        timeout_per_call="client_timeout",
    ),
    "http": Transport(
        name="http",
        default_url="127.0.0.1:8000",
        sync_module="tritonclient.http",
        async_module="tritonclient.http.aio",
        sync_timeout_kwargs=("connection_timeout", "network_timeout"),
        async_timeout_kwargs=("conn_timeout",),
        timeout_per_call=None,
    ),
}


def transport_for(protocol: str) -> Transport:
    try:
        return TRANSPORTS[protocol.lower()]
    except KeyError:
        raise ValueError(f"protocol must be one of {', '.join(TRANSPORTS)}, got {protocol!r}") from None


def normalize_url(url: str | None, transport: Transport) -> str:
    """`url` as tritonclient wants it ("host:port", no scheme), or the protocol's default port on loopback."""
    if not url:
        return transport.default_url
    for scheme in ("grpc://", "http://"):
        if url.startswith(scheme):
            url = url[len(scheme) :]
    return url.rstrip("/")
