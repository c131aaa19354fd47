"""The gateway's ASGI app: the three APIs, the page, ``/metrics`` and ``/health``, with the request-size limit
and the error format of each API. FastAPI on uvicorn, chosen by measurement (BENCHMARKS.md, gateway)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import deepl, libre, plain
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


def build_app(settings: GatewaySettings, keys: Keys | None = None) -> FastAPI:
    keys = keys if keys is not None else Keys.configured(settings.keys_file, settings.usage_file)
    metrics = GatewayMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = GatewayState(keys, Triton(settings.triton_url, settings.timeout_s), metrics)
        app.state.gateway = state
        saver = asyncio.ensure_future(_save_usage_every(keys, USAGE_SAVE_INTERVAL_S))
        try:
            yield
        finally:
            saver.cancel()
            keys.save_usage()
            await state.triton.close()

    app = FastAPI(
        title="ropeserve gateway",
        summary="DeepL API v2, LibreTranslate and plain JSON for the ropeserve models on Triton",
        version="1",
        lifespan=lifespan,
    )
    app.include_router(deepl.router)
    app.include_router(libre.router)
    app.include_router(plain.build_router())

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, error: GatewayError) -> JSONResponse:
        return error_response(request.url.path, error)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {e['msg']}" for e in error.errors())
        return error_response(request.url.path, GatewayError(400, problems or "invalid request"))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return error_response(request.url.path, GatewayError(error.status_code, str(error.detail)))

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/health", summary="200 when Triton behind the gateway is ready, else 503")
    async def health(request: Request) -> JSONResponse:
        ready = await state_of(request).triton.client.is_ready()
        return JSONResponse({"triton_ready": ready}, status_code=200 if ready else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics_page(request: Request) -> Response:
        return metrics.endpoint(request)

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # the outermost: it also counts the 413s
    return app


async def _save_usage_every(keys: Keys, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        await asyncio.to_thread(keys.save_usage)
