"""The gateway's Prometheus metrics, on its own ``/metrics``: per route (its template, not the raw path), status
and key id (never the key). Triton's own metrics stay on Triton's port."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "ropeserve_gateway_requests",
            "requests answered, by route, HTTP status and key id",
            ["route", "status", "key"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "ropeserve_gateway_request_seconds",
            "time to the answer's first byte, by route",
            ["route"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.characters = Counter(
            "ropeserve_gateway_characters", "source characters served, by key id", ["key"], registry=self.registry
        )

    async def endpoint(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE)


class MetricsMiddleware:
    """Counts every answer (errors included) under its route template; the key id comes from the handler
    through ``scope["state"]``."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, templates: dict[object, str]) -> None:
        self.app = app
        self.metrics = metrics
        self.templates = templates  # endpoint -> its route's path template

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                self.metrics.seconds.labels(self.route_of(scope)).observe(time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            key = scope.get("state", {}).get("key_id", "")
            self.metrics.requests.labels(self.route_of(scope), str(status), key).inc()

    def route_of(self, scope: Scope) -> str:
        """The template of the route that matched (``/v1/translate``), or "other": raw paths would let any client
        create a new time series per request."""
        return self.templates.get(scope.get("endpoint"), "other")
