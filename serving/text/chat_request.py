"""A chat twin's request (`<task>_chat`, tasks/definition.py): one JSON object in its TEXT, the conversation or the
raw prompt a client wrote and how to decode it. The gateway's OpenAI API (serving/gateway/openai_api.py) writes it
from a `/v1/chat/completions` or `/v1/completions` body; anyone may send it to Triton directly::

    {"messages": [{"role": "user", "content": "把这句话翻译成英文：我爱你。"}], "max_tokens": 64,
     "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05, "seed": 1, "stop": ["\\n\\n"]}

`messages` (rendered with the checkpoint's chat template) or `prompt` (a text the model continues as it is), one of
them; every other field is optional: a field left out takes the checkpoint's sampling defaults (config.json's
`generation.sampling`, the folder's generation config), and `temperature` 0 decodes greedily. Anything else is
refused by name: a misspelt field would otherwise fall back to its default without a word.

Standard library only: the gateway imports it without the server's packages.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant")
MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_STOP_CHARACTERS = 64
MAX_MESSAGES = 256
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty")
FIELDS = ("messages", "prompt", "max_tokens", "seed", "stop", *SAMPLING_FIELDS)


class ChatRequestError(ValueError):
    """What is wrong with a chat request, naming the field (`param`) as OpenAI's errors do."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[tuple[str, str], ...] | None  # (role, content), or None for a raw prompt
    prompt: str | None
    max_tokens: int | None  # None: as many as the context leaves
    temperature: float | None  # None: the checkpoint's default; 0: greedy
    top_p: float | None
    top_k: int | None  # 0 (or OpenAI-style -1): off
    repetition_penalty: float | None
    seed: int | None
    stop: tuple[str, ...] = ()

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages or ()]

    def with_defaults(self, defaults: dict[str, float]) -> ChatRequest:
        """The sampling fields the request left out, from `defaults` (config.json's generation.sampling)."""
        values = {name: getattr(self, name) for name in SAMPLING_FIELDS}
        for name, value in defaults.items():
            if name in values and values[name] is None:
                values[name] = int(value) if name == "top_k" else float(value)
        return ChatRequest(self.messages, self.prompt, self.max_tokens, seed=self.seed, stop=self.stop, **values)

    def to_json(self) -> str:
        body: dict[str, Any] = {"prompt": self.prompt} if self.messages is None else {"messages": self.conversation()}
        for name in ("max_tokens", "seed", *SAMPLING_FIELDS):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.stop:
            body["stop"] = list(self.stop)
        return json.dumps(body, ensure_ascii=False)


def parse(text: str) -> ChatRequest:
    """The request in a chat twin's TEXT; `ChatRequestError` names what is wrong."""
    try:
        body = json.loads(text)
    except ValueError as err:
        raise ChatRequestError(f"a chat request must be a JSON object: {err}") from None
    if not isinstance(body, dict):
        raise ChatRequestError(f"a chat request must be a JSON object, got {type(body).__name__}")
    return from_fields(body)


def from_fields(body: dict[str, Any]) -> ChatRequest:
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise ChatRequestError(f"unknown field {unknown[0]!r} (known: {', '.join(FIELDS)})", unknown[0])
    if ("messages" in body) == ("prompt" in body):
        raise ChatRequestError("give exactly one of 'messages' (a conversation) and 'prompt' (a text to continue)")
    messages = _messages(body["messages"]) if "messages" in body else None
    prompt = None
    if "prompt" in body:
        prompt = body["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise ChatRequestError("'prompt' must be a non-empty string", "prompt")
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0, low_open=True)
    repetition_penalty = _number(body, "repetition_penalty", 0.0, 10.0, low_open=True)
    top_k = _integer(body, "top_k", -1, 1 << 20)
    return ChatRequest(
        messages=messages,
        prompt=prompt,
        max_tokens=_integer(body, "max_tokens", 1, 1 << 20),
        temperature=temperature,
        top_p=top_p,
        top_k=None if top_k is None else max(top_k, 0),
        repetition_penalty=repetition_penalty,
        seed=_integer(body, "seed", -(1 << 63), (1 << 64) - 1),
        stop=_stop(body.get("stop")),
    )


def _messages(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, list) or not raw:
        raise ChatRequestError("'messages' must be a non-empty list of {role, content} objects", "messages")
    if len(raw) > MAX_MESSAGES:
        raise ChatRequestError(f"'messages' holds {len(raw)} messages; the limit is {MAX_MESSAGES}", "messages")
    out = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ChatRequestError(f"{where} must be an object with 'role' and 'content'", where)
        extra = sorted(set(message) - {"role", "content", "name"})
        if extra:
            raise ChatRequestError(f"{where}.{extra[0]} is not supported (no tools or function calls)", where)
        role = message.get("role")
        if role not in ROLES:
            raise ChatRequestError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", f"{where}.role")
        out.append((role, _content(message.get("content"), f"{where}.content")))
    return tuple(out)


def _content(raw: Any, where: str) -> str:
    """A message's text: a string, or OpenAI's list of text parts (joined)."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list) and all(isinstance(part, dict) for part in raw):
        texts = []
        for part in raw:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ChatRequestError(f"{where} may hold only text parts, got {part.get('type')!r}", where)
            texts.append(part["text"])
        return "".join(texts)
    raise ChatRequestError(f"{where} must be a string or a list of text parts", where)


def _number(body: dict[str, Any], name: str, low: float, high: float, low_open: bool = False) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ChatRequestError(f"'{name}' must be a number, got {value!r}", name)
    if value > high or value < low or (low_open and value == low):
        bounds = f"{'above' if low_open else 'at least'} {low:g} and at most {high:g}"
        raise ChatRequestError(f"'{name}' must be {bounds}, got {value!r}", name)
    return float(value)


def _integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ChatRequestError(f"'{name}' must be an integer, got {value!r}", name)
    if not low <= value <= high:
        raise ChatRequestError(f"'{name}' must be between {low} and {high}, got {value}", name)
    return value


def _stop(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ChatRequestError("'stop' must be a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARACTERS for s in stops):
        raise ChatRequestError(
            f"'stop' takes at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARACTERS} characters", "stop"
        )
    return tuple(stops)
