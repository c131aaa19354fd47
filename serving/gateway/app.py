"""The gateway's ASGI app: the four APIs (DeepL, LibreTranslate, plain JSON, OpenAI's for chat models), the page,
``/metrics``, ``/health`` and ``/openapi.json``, with the request-size limit and the error format of each API.

Starlette on uvicorn (httptools, uvloop), chosen by measurement: in front of the same Triton, 32 clients of
``/v1/sentiment`` got 1.2 k requests/s through FastAPI with a typed body, 1.3–1.6 k through Starlette and 1.7 k
through a bare ASGI function, against 2.0 k straight over gRPC (BENCHMARKS.md, gateway). FastAPI's layers cost
more CPU than they give here, where the routes are written from the task definitions anyway."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import deepl, libre, openai_api, openapi, plain
from .errors import GatewayError, error_response
from .gateway_state import GatewayState, state_of
from .keys import Keys
from .metrics import GatewayMetrics, MetricsMiddleware
from .service import Triton

STATIC = Path(__file__).with_name("static")
MAX_BODY_BYTES = 128 * 1024  # DeepL's limit for a request's body
USAGE_SAVE_INTERVAL_S = 1.0


@dataclass(frozen=True)
class GatewaySettings:
    triton_url: str = "127.0.0.1:8001"
    timeout_s: float = 60.0
    keys_file: Path | None = None
    usage_file: Path | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    translator: str = "translate"  # the task behind DeepL's and LibreTranslate's APIs


class BodyLimit:
    """413 for a body over the limit, by its Content-Length or, for a chunked body, as the bytes arrive."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = GatewayError(413, f"the request body exceeds {self.limit // 1024} KiB")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await error_response(scope["path"], too_big)(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise too_big
            return message

        await self.app(scope, counting_receive, send)


async def page(request: Request) -> Response:
    return FileResponse(STATIC / "index.html")


async def health(request: Request) -> Response:
    """200 when Triton behind the gateway is ready, else 503."""
    ready = await state_of(request).triton.client.is_ready()
    return JSONResponse({"triton_ready": ready}, status_code=200 if ready else 503)


def build_app(settings: GatewaySettings, keys: Keys | None = None) -> Starlette:
    keys = keys if keys is not None else Keys.configured(settings.keys_file, settings.usage_file)
    metrics = GatewayMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state = GatewayState(keys, Triton(settings.triton_url, settings.timeout_s, settings.translator), metrics)
        app.state.gateway = state
        saver = asyncio.ensure_future(_save_usage_every(keys, USAGE_SAVE_INTERVAL_S))
        try:
            yield
        finally:
            saver.cancel()
            keys.save_usage()
            await state.triton.close()

    described = [(route, None, (route.endpoint.__doc__ or "").strip()) for route in deepl.routes + libre.routes]
    described += [(route, None, (route.endpoint.__doc__ or "").strip()) for route in openai_api.routes]
    described += plain.routes()
    described.append((Route("/health", health, methods=["GET"], name="health"), None, health.__doc__ or ""))
    schema = openapi.document(described)

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(schema)

    async def gateway_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, GatewayError)
        return error_response(request.url.path, error)

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        return error_response(request.url.path, GatewayError(error.status_code, str(error.detail)))

    routes = [route for route, _, _ in described] + [
        Route("/", page, methods=["GET"], name="page"),
        Route("/openapi.json", openapi_json, methods=["GET"], name="openapi"),
        Route("/metrics", metrics.endpoint, methods=["GET"], name="metrics"),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={GatewayError: gateway_error, HTTPException: http_error},
    )
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics, templates=_templates(routes))  # outermost: counts 413s
    return app


def _templates(routes: list[Route | Mount]) -> dict[object, str]:
    """Each route's endpoint → its path template: the metrics' route label."""
    return {getattr(route, "endpoint", route.app): route.path for route in routes}


async def _save_usage_every(keys: Keys, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        await asyncio.to_thread(keys.save_usage)
