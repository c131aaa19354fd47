"""Plain JSON for every task, built from the task definitions (``tasks/*.toml``) as the SDK is:

- ``POST /v1/<task>`` ``{"texts": [...], <options>}`` → ``{"results": [...]}``, one result per text;
- ``POST /v1/<task>/stream`` ``{"text": ..., <options>}`` → server-sent events (``data: {...}`` lines): first
  ``{"sentences": [...]}``, the pieces the text is read as; then ``{"sentence": i, "text": ...}`` as each is
  generated and ``{"separator": ...}`` between sentences, in order; last ``event: done``. Their texts and
  separators joined equal ``/v1/<task>``'s result. An error after the stream started comes as ``event: error``.
- ``POST /v1/explain/<task>`` ``{"text": ...}`` → the answer with its tokens and attention matrices.

The key goes in ``Authorization: Bearer <key>``. Options have the task's types, ranges and defaults, and the
OpenAPI schema (``/openapi.json``, ``/docs``) shows them.
"""

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, create_model

from clients.explain import DECODERS as EXPLAINED
from clients.task_definitions import Option, Task, registry

from .errors import GatewayError
from .gateway_state import state_of

MAX_TEXTS = 50
MAX_TEXT_CHARACTERS = 10_000


def _option_field(option: Option) -> tuple[Any, Any]:
    if option.choices:
        kind: Any = Literal[tuple(option.choices)]  # type: ignore[valid-type]
        return kind | None, Field(None, description=f"{option.help}; default {option.default}")
    described = f"{option.help}; default {option.default}"
    return int | None, Field(None, ge=option.low, le=option.high, description=described)


def _models(task: Task) -> tuple[type[BaseModel], type[BaseModel]]:
    options = {option.keyword: _option_field(option) for option in task.options}
    config = ConfigDict(extra="forbid")  # a misspelt option is an error, not a default silently applied
    texts = create_model(
        f"{task.name.title()}Request",
        __config__=config,
        texts=(list[str], Field(min_length=1, max_length=MAX_TEXTS, description="texts, one result each")),
        **options,
    )
    one = create_model(
        f"{task.name.title()}StreamRequest",
        __config__=config,
        text=(str, Field(min_length=1, max_length=MAX_TEXT_CHARACTERS)),
        **options,
    )
    return texts, one


def _set(body: BaseModel, *skip: str) -> dict[str, Any]:
    return {k: v for k, v in body.model_dump().items() if k not in skip and v is not None}


def _add_task(router: APIRouter, task: Task) -> None:
    texts_model, text_model = _models(task)
    name = task.name

    async def answer(request: Request, body: texts_model) -> JSONResponse:  # type: ignore[valid-type]
        state = state_of(request)
        account = state.authenticate(request, {})
        async with state.metered(account, sum(len(t) for t in body.texts)):  # type: ignore[attr-defined]
            results = await state.triton.answers(name, body.texts, _set(body, "texts"))  # type: ignore[attr-defined]
        return JSONResponse({"results": results})

    router.add_api_route(f"/{name}", answer, methods=["POST"], summary=task.summary, name=name)

    if task.stream is not None:

        async def stream(request: Request, body: text_model) -> StreamingResponse:  # type: ignore[valid-type]
            state = state_of(request)
            account = state.authenticate(request, {})
            async with state.metered(account, len(body.text)):  # type: ignore[attr-defined]
                events = state.triton.stream(name, body.text, _set(body, "text"))  # type: ignore[attr-defined]
                first = await anext(events)  # the sentences, before the status: a bad text still gets its 400
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            return StreamingResponse(_sse(first, events), media_type="text/event-stream", headers=headers)

        router.add_api_route(
            f"/{name}/stream", stream, methods=["POST"], name=f"{name}_stream",
            summary=f"{task.summary}: streamed as server-sent events",
        )  # fmt: skip

    if task.explain is not None and name in EXPLAINED:
        explain_model = create_model(
            f"{task.name.title()}ExplainRequest",
            __config__=ConfigDict(extra="forbid"),
            text=(str, Field(min_length=1, max_length=MAX_TEXT_CHARACTERS)),
        )

        async def explain(request: Request, body: explain_model) -> JSONResponse:  # type: ignore[valid-type]
            state = state_of(request)
            account = state.authenticate(request, {})
            async with state.metered(account, len(body.text)):  # type: ignore[attr-defined]
                answer = await state.triton.explain(name, body.text)  # type: ignore[attr-defined]
            return JSONResponse(answer)

        router.add_api_route(
            f"/explain/{name}", explain, methods=["POST"], name=f"{name}_explain",
            summary=f"{task.summary}, with tokens and attention",
        )  # fmt: skip


async def _sse(first: dict[str, Any], events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    yield _event(first)
    try:
        async for event in events:
            yield _event(event)
    except GatewayError as error:
        yield _event({"error": error.message, "status": error.status}, "error")
        return
    yield _event({}, "done")


def _event(data: dict[str, Any], name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def build_router() -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["ropeserve"])

    @router.get("/tasks", summary="The tasks, their options and what streams or explains")
    async def tasks() -> JSONResponse:
        return JSONResponse(
            [
                {
                    "name": task.name,
                    "summary": task.summary,
                    "stream": task.stream is not None,
                    "explain": task.explain is not None and task.name in EXPLAINED,
                    "options": [
                        {
                            "name": o.keyword,
                            "default": o.default,
                            "help": o.help,
                            **({"choices": list(o.choices)} if o.choices else {"range": [o.low, o.high]}),
                        }
                        for o in task.options
                    ],
                }
                for task in registry().values()
            ]
        )

    for task in registry().values():
        _add_task(router, task)
    return router
