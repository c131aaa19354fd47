"""OpenAI's API for the chat models (an imported decoder-only model's `<task>_chat` twin), as vLLM, llama.cpp's
server and OpenVINO Model Server speak it, so that `openai.OpenAI(base_url="http://127.0.0.1:5000/v1")` works:

- ``GET /v1/models``: the chat models, by task name (what `model` names);
- ``POST /v1/chat/completions``: `messages` rendered with the model's chat template;
- ``POST /v1/completions``: a `prompt` the model continues as it is.

Both take `max_tokens` (or `max_completion_tokens`), `temperature` (0: greedy), `top_p`, `seed`, `stop` and
`stream` (server-sent events ending in ``data: [DONE]``, with `stream_options.include_usage` a last chunk of
`usage`), and vLLM's `top_k` and `repetition_penalty`; a field left out takes the model's own sampling defaults
(its generation config). Answers carry `usage` (prompt and completion tokens) and `finish_reason` ("stop" or
"length"). What cannot be honoured (n > 1, tools, logprobs, penalties other than 0) is refused by name, and
errors have OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``). Keys and quotas are the other
APIs': ``Authorization: Bearer <key>``, the characters of the messages charged.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from clients import ClientError
from clients.chat import ChatChunk
from clients.task_definitions import registry
from serving.text.chat_request import ChatRequest, ChatRequestError, from_fields

from .errors import OPENAI_PATHS, GatewayError, from_client_error, openai_body
from .gateway_state import state_of

# Fields OpenAI's clients may send that change nothing at these values; any other value is refused.
NEUTRAL = {"n": 1, "presence_penalty": 0, "frequency_penalty": 0, "logprobs": False, "echo": False, "best_of": 1}
IGNORED = ("user", "stream_options", "stream", "model")  # read here, or (user) only a label for abuse tracking


def chat_models() -> list[str]:
    return [task.name for task in registry().values() if task.chat is not None]


async def models(request: Request) -> Response:
    """The chat models the server has ready (OpenAI's model list): each an imported decoder-only task."""
    state = state_of(request)
    state.authenticate(request, {})
    names = chat_models()
    ready = await asyncio.gather(*(state.triton.client.is_ready(name) for name in names))
    served = [name for name, up in zip(names, ready) if up]
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "ropeserve"} for name in served]
    return JSONResponse({"object": "list", "data": data})


async def chat_completions(request: Request) -> Response:
    """Answer a conversation (OpenAI's chat completions)."""
    return await _complete(request, chat=True)


async def completions(request: Request) -> Response:
    """Continue a prompt (OpenAI's legacy completions)."""
    return await _complete(request, chat=False)


async def _complete(request: Request, chat: bool) -> Response:
    state = state_of(request)
    account = state.authenticate(request, {})
    body = await _body(request)
    model = body.get("model")
    if model not in chat_models():
        message = f"the model {model!r} does not exist (GET /v1/models lists them)"
        raise GatewayError(404, message, param="model", code="model_not_found")
    chat_request = _chat_request(body, chat)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise GatewayError(400, f"'stream' must be true or false, got {stream!r}", param="stream")
    include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))
    characters = sum(len(c) for _, c in chat_request.messages or ()) + len(chat_request.prompt or "")
    answer = Answer(model, chat)
    async with state.metered(account, characters):
        chunks = _chunks(state.triton.client.chat(model, chat_request.to_json()))
        first = await anext(chunks)  # before the status: a refused request still gets its 4xx
        if not stream:
            answer.add(first)
            async for chunk in chunks:
                answer.add(chunk)
            return JSONResponse(answer.whole())
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(_events(answer, first, chunks, include_usage), media_type="text/event-stream",
                             headers=headers)  # fmt: skip


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as err:
        raise GatewayError(400, f"the body is not JSON: {err}") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "the body must be a JSON object")
    return body


def _chat_request(body: dict[str, Any], chat: bool) -> ChatRequest:
    """The chat twin's request from an OpenAI body: its own fields passed on, the neutral ones checked."""
    fields = {key: value for key, value in body.items() if key not in IGNORED and key not in NEUTRAL}
    for key, neutral in NEUTRAL.items():
        if key in body and body[key] is not None and body[key] != neutral:
            message = f"'{key}' is supported only as {json.dumps(neutral)}, got {body[key]!r}"
            raise GatewayError(400, message, param=key)
    if "max_completion_tokens" in fields:
        fields["max_tokens"] = fields.pop("max_completion_tokens")
    fields = {key: value for key, value in fields.items() if value is not None}
    if chat and "prompt" in fields:
        raise GatewayError(400, "chat completions take 'messages'; /v1/completions takes 'prompt'", param="prompt")
    if not chat:
        if "messages" in fields:
            message = "/v1/completions takes 'prompt'; chat completions take 'messages'"
            raise GatewayError(400, message, param="messages")
        prompt = fields.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            fields["prompt"] = prompt[0]
        elif isinstance(prompt, list):
            message = "'prompt' must be one string (a list of several is not supported)"
            raise GatewayError(400, message, param="prompt")
    elif "messages" not in fields:
        raise GatewayError(400, "'messages' is required", param="messages")
    try:
        return from_fields(fields)
    except ChatRequestError as err:
        raise GatewayError(400, str(err), param=err.param) from None


async def _chunks(chunks: AsyncIterator[ChatChunk]) -> AsyncIterator[ChatChunk]:
    """The chat twin's chunks, Triton's errors as the gateway's."""
    try:
        async for chunk in chunks:
            yield chunk
    except ClientError as error:
        raise from_client_error(error) from None


class Answer:
    """One completion's identity and, gathered from its chunks, its text, finish reason and usage."""

    def __init__(self, model: str, chat: bool) -> None:
        self.model = model
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.text: list[str] = []
        self.last: ChatChunk | None = None

    def add(self, chunk: ChatChunk) -> None:
        self.text.append(chunk.text)
        self.last = chunk

    def usage(self) -> dict[str, int]:
        prompt, completion = (self.last.prompt_tokens, self.last.completion_tokens) if self.last else (0, 0)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def whole(self) -> dict[str, Any]:
        reason = self.last.finish_reason if self.last else "stop"
        text = "".join(self.text)
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return self._object("chat.completion" if self.chat else "text_completion", [choice], usage=self.usage())

    def chunk(self, text: str | None, reason: str | None, first: bool = False) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason or None, "logprobs": None}
        if self.chat:
            delta: dict[str, str] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        return self._object("chat.completion.chunk" if self.chat else "text_completion", [choice])

    def _object(self, kind: str, choices: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices,
                **more}  # fmt: skip


async def _events(
    answer: Answer, first: ChatChunk, chunks: AsyncIterator[ChatChunk], include_usage: bool
) -> AsyncIterator[bytes]:
    """The stream as OpenAI sends it: the role first (chat), then a chunk per piece, the last with its finish
    reason, then the usage if asked for, then ``[DONE]``; an error after the start as an error event."""
    if answer.chat:
        yield _event(answer.chunk("", None, first=True))
    try:
        chunk: ChatChunk | None = first
        pending = chunks
        while chunk is not None:
            answer.add(chunk)
            if chunk.text:
                yield _event(answer.chunk(chunk.text, None))
            if chunk.finish_reason:
                yield _event(answer.chunk(None if answer.chat else "", chunk.finish_reason))
            chunk = await anext(pending, None)
    except GatewayError as error:
        yield _event(openai_body(error))
        return
    if include_usage:
        yield _event({**answer.chunk(None, None), "choices": [], "usage": answer.usage()})
    yield b"data: [DONE]\n\n"


def _event(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


models_path, chat_path, completions_path = OPENAI_PATHS
routes = [
    Route(models_path, models, methods=["GET"], name="openai_models"),
    Route(chat_path, chat_completions, methods=["POST"], name="openai_chat_completions"),
    Route(completions_path, completions, methods=["POST"], name="openai_completions"),
]
