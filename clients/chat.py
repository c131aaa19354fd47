"""A chat model's answer, streamed with why it ended and its token counts: `<task>_chat`, the twin an imported
decoder-only model has (its definition's `[chat]` table). Its TEXT is one chat request as JSON
(serving/text/chat_request.py on the server says what it holds: `messages` or `prompt`, `max_tokens`,
`temperature`, `top_p`, `top_k`, `repetition_penalty`, `seed`, `stop`); each response holds the text that became
certain since the last one, and the last one FINISH_REASON ("stop" or "length").

    async for chunk in client.chat("qwen_translate", {"messages": [{"role": "user", "content": "你好"}]}):
        print(chunk.text, end="")
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from .endpoints import text_tensor, to_infer_input
from .streaming import grpc_responses_async
from .task_definitions import get as get_task


@dataclass(frozen=True)
class ChatChunk:
    """A piece of the answer; `finish_reason` is set on the last one ("stop", "length"; "" before it)."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


def chat_model(task: str) -> str:
    definition = get_task(task)
    if definition.chat is None:
        raise ValueError(f"{task} has no chat twin (its definition has no [chat] table: not a chat model)")
    return str(definition.chat.name)


async def chat_stream_async(
    url: str, timeout_s: float, task: str, request: Mapping[str, Any] | str
) -> AsyncIterator[ChatChunk]:
    import tritonclient.grpc.aio as grpcaio

    body = request if isinstance(request, str) else json.dumps(dict(request), ensure_ascii=False)
    inputs = [to_infer_input("TEXT", text_tensor([body]), grpcaio.InferInput)]
    async for result in grpc_responses_async(url, timeout_s, chat_model(task), inputs):
        yield ChatChunk(
            bytes(_first(result, "TEXT")).decode("utf-8"),
            bytes(_first(result, "FINISH_REASON")).decode("utf-8"),
            int(_first(result, "PROMPT_TOKENS")),
            int(_first(result, "COMPLETION_TOKENS")),
        )


def _first(result: Any, name: str) -> Any:
    array = result.as_numpy(name)
    return array.reshape(-1)[0]
