"""Plain JSON for every task, built from the task definitions (``tasks/*.toml``) as the SDK is:

- ``POST /v1/<task>`` ``{"texts": [...], <options>}`` → ``{"results": [...]}``, one result per text;
- ``POST /v1/<task>/stream`` ``{"text": ..., <options>}`` → server-sent events (``data: {...}`` lines): first
  ``{"sentences": [...]}``, the pieces the text is read as; then ``{"sentence": i, "text": ...}`` as each is
  generated and ``{"separator": ...}`` between sentences, in order; last ``event: done``. Their texts and
  separators joined equal ``/v1/<task>``'s result. An error after the stream started comes as ``event: error``.
- ``POST /v1/explain/<task>`` ``{"text": ...}`` → the answer with its tokens and attention matrices.

The key goes in ``Authorization: Bearer <key>``. Options have the task's types, ranges and defaults, and the
OpenAPI schema (``/openapi.json``) shows them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from clients.explain import DECODERS as EXPLAINED
from clients.task_definitions import Option, Task, registry

from .errors import GatewayError
from .fields import MAX_TEXTS
from .gateway_state import state_of

MAX_TEXT_CHARACTERS = 10_000


def _option_field(option: Option) -> tuple[Any, Any]:
    described = f"{option.help}; default {option.default}"
    if option.choices:
        kind: Any = Literal[tuple(option.choices)]  # type: ignore[valid-type]
        return kind | None, Field(None, description=described)
    return int | None, Field(None, ge=option.low, le=option.high, description=described)


def _model(name: str, task: Task, with_options: bool = True, **fields: Any) -> type[BaseModel]:
    """A request body: ``fields`` and the task's options; a field it does not name is an error (a misspelt option
    would otherwise fall back to its default without a word)."""
    options = {option.keyword: _option_field(option) for option in task.options} if with_options else {}
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields, **options)


async def parsed(request: Request, model: type[BaseModel]) -> BaseModel:
    """The body as `model`, or 400 naming each problem (``num_beams: Input should be less than or equal to 8``)."""
    try:
        return model.model_validate_json(await request.body() or b"{}")
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in error.errors())
        raise GatewayError(400, problems) from None


def _set(body: BaseModel, *skip: str) -> dict[str, Any]:
    return {k: v for k, v in body.model_dump().items() if k not in skip and v is not None}


def task_routes(task: Task) -> list[tuple[Route, type[BaseModel], str]]:
    """(route, its body's model, its summary) for `task`: answers, and its stream and explanation if it has them."""
    name = task.name
    title = name.title().replace("_", "")
    texts = (list[str], Field(min_length=1, max_length=MAX_TEXTS, description="texts, one result each"))
    text = (str, Field(min_length=1, max_length=MAX_TEXT_CHARACTERS))
    answers_model = _model(f"{title}Request", task, texts=texts)

    async def answer(request: Request) -> Response:
        state = state_of(request)
        account = state.authenticate(request, {})
        body: Any = await parsed(request, answers_model)
        async with state.metered(account, sum(len(t) for t in body.texts)):
            results = await state.triton.answers(name, body.texts, _set(body, "texts"))
        return JSONResponse({"results": results})

    routes = [(Route(f"/v1/{name}", answer, methods=["POST"], name=name), answers_model, task.summary)]

    if task.stream is not None:
        stream_model = _model(f"{title}StreamRequest", task, text=text)

        async def stream(request: Request) -> Response:
            state = state_of(request)
            account = state.authenticate(request, {})
            body: Any = await parsed(request, stream_model)
            async with state.metered(account, len(body.text)):
                events = state.triton.stream(name, body.text, _set(body, "text"))
                first = await anext(events)  # the sentences, before the status: a bad text still gets its 400
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            return StreamingResponse(_sse(first, events), media_type="text/event-stream", headers=headers)

        summary = f"{task.summary}: streamed as server-sent events"
        routes.append((Route(f"/v1/{name}/stream", stream, methods=["POST"], name=f"{name}_stream"), stream_model,
                       summary))  # fmt: skip

    if task.explain is not None and name in EXPLAINED:
        explain_model = _model(f"{title}ExplainRequest", task, with_options=False, text=text)

        async def explain(request: Request) -> Response:
            state = state_of(request)
            account = state.authenticate(request, {})
            body: Any = await parsed(request, explain_model)
            async with state.metered(account, len(body.text)):
                answer = await state.triton.explain(name, body.text)
            return JSONResponse(answer)

        summary = f"{task.summary}, with its tokens and attention"
        routes.append((Route(f"/v1/explain/{name}", explain, methods=["POST"], name=f"{name}_explain"), explain_model,
                       summary))  # fmt: skip
    return routes


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


async def tasks(request: Request) -> Response:
    """The tasks, what they answer, whether the server has them ready, their options, and which stream, explain
    or chat."""
    defined = list(registry().values())
    ready = await asyncio.gather(*(state_of(request).triton.client.is_ready(task.name) for task in defined))
    return JSONResponse(
        [
            {
                "name": task.name,
                "ready": up,
                "summary": task.summary,
                "output": task.endpoint.outputs[0].name,  # what it answers: TRANSLATION, SUMMARY, ...
                "stream": task.stream is not None,
                "chat": task.chat is not None,
                "explain": task.explain is not None and task.name in EXPLAINED,
                "options": [
                    {
                        "name": o.keyword,
                        "default": o.default,
                        "help": o.help,
                        **({"choices": list(o.choices)} if o.choices else {"range": [o.low, o.high]}),
                    }
                    for o in task.options
                ],  # fmt: skip
            }
            for task, up in zip(defined, ready)
        ]
    )


def routes() -> list[tuple[Route, type[BaseModel] | None, str]]:
    """Every /v1 route with its body's model (None: no body) and summary, for the app and its OpenAPI schema."""
    found: list[tuple[Route, type[BaseModel] | None, str]] = [
        (Route("/v1/tasks", tasks, methods=["GET"], name="tasks"), None, "The tasks, their options, and which "
         "stream or explain")
    ]  # fmt: skip
    for task in registry().values():
        found += task_routes(task)
    return found
