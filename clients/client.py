"""Blocking and asyncio clients for the Triton endpoints: one method per task of ``tasks/*.toml``.

    from clients import Client

    with Client() as client:  # gRPC on 127.0.0.1:8001; Client(protocol="http") for :8000
        client.sentiment(["这部电影不差", "太难看了"])
        # -> [Sentiment(label='positive', score=0.97), Sentiment(label='negative', score=0.97)]
        client.translate("我爱你。", num_beams=4)  # -> ['I love you.']
        client.explain("translate", "我爱你。")[0].attention  # -> [layers, target, source] cross-attention

Each task is a method named after it (``client.translate``), with the task's options as keyword arguments
(``client.infer("translate", texts, num_beams=4)`` is the same call). The built-in tasks' methods are written out,
typed, for IDEs and type checkers (a test holds their keywords to the definitions); a task defined in a folder of
``$ROPESERVE_TASKS_PATH`` gets its method from its definition, untyped.

Conventions shared by both clients:

- Every method takes one `str` or a sequence of them and always returns a list, one result per text, in
  input order: a lone str is simply a batch of one. One call is one Triton request, so a batch may not exceed
  the model's ``max_batch_size`` (64 for the endpoints, 8 for the explain models); split bigger inputs yourself.
- `max_new_tokens` / `num_beams` left as None are not sent, so the server's defaults apply (4 beams).
- Failures raise `ClientError` (`ServerUnreachable` when nothing answers). Overload and unreachable servers
  are retried per `RetryPolicy` (3 attempts by default; pass ``retry=None`` to turn that off), because all
  three endpoints are idempotent.
- `timeout_s` bounds each attempt, not the whole call with its retries.
- A gRPC `Client` may be shared between threads; an HTTP `Client` holds a single connection: use one per
  thread.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .chat import ChatChunk, chat_stream_async
from .endpoints import Endpoint, build_inputs, endpoint, endpoints, normalize_texts
from .errors import ClientError, translated_errors
from .explain import SentimentAttention, TranslationAlignment, explain_endpoint, explain_options
from .retry import RetryPolicy, call_with_retry, call_with_retry_async
from .streaming import (
    grpc_stream,
    grpc_stream_async,
    http_stream,
    http_stream_async,
    retried_start,
    retried_start_async,
)
from .task_definitions import get as get_task
from .transport import DEFAULT_TIMEOUT_S, normalize_url, transport_for

if TYPE_CHECKING:
    from typing import Self  # Python 3.11+; only read by type checkers, the SDK also runs on 3.10

T = TypeVar("T")

DEFAULT_RETRY = RetryPolicy()
Texts = str | Sequence[str]


class SentimentResult(Protocol):
    """What `sentiment` answers per text (the ``Sentiment`` dataclass its definition's outputs make)."""

    label: str
    score: float


@dataclass(frozen=True)
class _Request:
    """Everything one infer() call sends, built once and reused by every retry."""

    model: str
    inputs: list[Any]
    outputs: list[Any]
    rows: int


class _ClientBase:
    """Settings and request building shared by both clients, which differ only in transport."""

    _asynchronous: bool

    def __init__(
        self,
        url: str | None,
        protocol: str,
        timeout_s: float,
        retry: RetryPolicy | None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.transport = transport_for(protocol)
        self.protocol = self.transport.name
        self.url = normalize_url(url, self.transport)
        self.timeout_s = float(timeout_s)
        self.retry = RetryPolicy.disabled() if retry is None else retry
        self._call_kwargs = self.transport.call_kwargs(self.timeout_s)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, protocol={self.protocol!r}, timeout_s={self.timeout_s})"

    def _prepare(self, endpoint: Endpoint[Any], texts: Texts, options: Mapping[str, int | str | None]) -> _Request:
        batch = normalize_texts(texts)
        module = self.transport.module(self._asynchronous)
        return _Request(
            model=endpoint.model,
            inputs=build_inputs(endpoint, batch, options, module.InferInput),
            outputs=[module.InferRequestedOutput(name) for name in endpoint.outputs],
            rows=len(batch),
        )

    def _errors(self) -> AbstractContextManager[None]:
        return translated_errors(self.url, self.timeout_s)

    def __getattr__(self, name: str) -> Any:
        """``client.<task>(texts, **options)`` for every task: :meth:`infer` with the task filled in."""
        if name.startswith("_") or name not in endpoints():
            raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")
        method = functools.partial(self.infer, name)
        method.__doc__ = endpoint_help(name)
        return method

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *endpoints()]


def endpoint_help(task: str) -> str:
    """The docstring of a task's method: what it returns and its options, from the definition."""
    definition = get_task(task)
    lines = [f"{definition.summary} (one result per text)."]
    lines += [f"{o.keyword}: {o.help}, {o.allowed} (server default {o.default})" for o in definition.options]
    return "\n".join(lines)


def _model_for(task: str) -> str:
    return endpoint(task).model


class Client(_ClientBase):
    """Blocking client (conventions in the module docstring). Use as a context manager or call close()."""

    _asynchronous = False

    def __init__(
        self,
        url: str | None = None,
        protocol: str = "grpc",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = DEFAULT_RETRY,
    ) -> None:
        super().__init__(url, protocol, timeout_s, retry)
        self._triton = self.transport.open(self.url, self.timeout_s, asynchronous=False)

    def infer(self, task: str, texts: Texts, **options: int | str | None) -> list[Any]:
        """`task`'s answer for each text; options (e.g. ``num_beams``) left as None get the server's default."""
        return self._infer(endpoint(task), texts, options)

    def sentiment(self, texts: Texts) -> list[SentimentResult]:
        """Each text's sentiment: ``Sentiment(label="positive" or "negative", score=its probability)``."""
        return self.infer("sentiment", texts)

    def translate(
        self,
        texts: Texts,
        *,
        max_new_tokens: int | None = None,
        num_beams: int | None = None,
        split_sentences: str | None = None,
    ) -> list[str]:
        """Each text in English; options left as None get the server's defaults (tasks/translate.toml)."""
        options = {"max_new_tokens": max_new_tokens, "num_beams": num_beams, "split_sentences": split_sentences}
        return self.infer("translate", texts, **options)

    def summarize(
        self, texts: Texts, *, max_new_tokens: int | None = None, num_beams: int | None = None, mode: str | None = None
    ) -> list[str]:
        """Each text's one-line summary; options left as None get the server's defaults (tasks/summarize.toml)."""
        return self.infer("summarize", texts, max_new_tokens=max_new_tokens, num_beams=num_beams, mode=mode)

    def explain(
        self, task: str, texts: Texts, **options: int | str | None
    ) -> list[TranslationAlignment] | list[SentimentAttention]:
        """`task`'s answer plus its tokens and attention matrices, one per text ("translate" or "sentiment")."""
        return self._infer(explain_endpoint(task), texts, explain_options(options))

    def stream(self, task: str, text: str, **options: int | str | None) -> Iterator[str]:
        """The pieces of `task`'s answer for one text as the server produces them (its `<task>_stream` twin);
        joined, they equal ``client.<task>(text)[0]``. Stopping early closes an HTTP stream; a gRPC stream's rest
        is read and dropped in the background, never cancelled, which Triton 2.51 mishandles (clients/streaming.py)."""
        run = grpc_stream if self.protocol == "grpc" else http_stream
        return retried_start(lambda: run(self.url, self.timeout_s, task, text, options), self.retry)

    def is_ready(self, task: str | None = None) -> bool:
        """Whether the server (and `task`'s model, if named) can take requests; False rather than raise."""
        model = None if task is None else _model_for(task)
        try:
            with self._errors():
                if model is None:
                    return bool(self._triton.is_server_ready(**self._call_kwargs))
                return bool(self._triton.is_model_ready(model, **self._call_kwargs))
        except ClientError:
            return False

    def close(self) -> None:
        self._triton.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _infer(self, endpoint: Endpoint[T], texts: Texts, options: Mapping[str, int | str | None]) -> list[T]:
        request = self._prepare(endpoint, texts, options)

        def attempt() -> Any:
            try:
                with self._errors():
                    return self._triton.infer(
                        request.model, request.inputs, outputs=request.outputs, **self._call_kwargs
                    )
            except ClientError as error:
                if RetryPolicy.reconnects(error):
                    # Threads still using the old connection keep it; it closes when they drop it.
                    self._triton = self.transport.open(self.url, self.timeout_s, asynchronous=False)
                raise

        return endpoint.decode(call_with_retry(attempt, self.retry), request.rows)


class AsyncClient(_ClientBase):
    """asyncio client with the same methods as `Client`, as coroutines. Use ``async with`` or await close().

    The underlying connection is opened on first use, inside the running event loop it will serve.
    """

    _asynchronous = True

    def __init__(
        self,
        url: str | None = None,
        protocol: str = "grpc",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = DEFAULT_RETRY,
    ) -> None:
        super().__init__(url, protocol, timeout_s, retry)
        self._opened: Any = None
        self._closing: set[asyncio.Future[None]] = set()  # connections left by a reconnect, closed once idle

    async def infer(self, task: str, texts: Texts, **options: int | str | None) -> list[Any]:
        """`task`'s answer for each text; options (e.g. ``num_beams``) left as None get the server's default."""
        return await self._infer(endpoint(task), texts, options)

    async def sentiment(self, texts: Texts) -> list[SentimentResult]:
        """Each text's sentiment: ``Sentiment(label="positive" or "negative", score=its probability)``."""
        return await self.infer("sentiment", texts)

    async def translate(
        self,
        texts: Texts,
        *,
        max_new_tokens: int | None = None,
        num_beams: int | None = None,
        split_sentences: str | None = None,
    ) -> list[str]:
        """Each text in English; options left as None get the server's defaults (tasks/translate.toml)."""
        options = {"max_new_tokens": max_new_tokens, "num_beams": num_beams, "split_sentences": split_sentences}
        return await self.infer("translate", texts, **options)

    async def summarize(
        self, texts: Texts, *, max_new_tokens: int | None = None, num_beams: int | None = None, mode: str | None = None
    ) -> list[str]:
        """Each text's one-line summary; options left as None get the server's defaults (tasks/summarize.toml)."""
        return await self.infer("summarize", texts, max_new_tokens=max_new_tokens, num_beams=num_beams, mode=mode)

    async def explain(
        self, task: str, texts: Texts, **options: int | str | None
    ) -> list[TranslationAlignment] | list[SentimentAttention]:
        """`task`'s answer plus its tokens and attention matrices, one per text ("translate" or "sentiment")."""
        return await self._infer(explain_endpoint(task), texts, explain_options(options))

    def stream(self, task: str, text: str, **options: int | str | None) -> AsyncIterator[str]:
        """`Client.stream` as an async iterator: ``async for piece in client.stream("translate", text)``.
        Stopping early leaves the rest of the answer to a task that reads and drops it (never a cancel)."""
        run = grpc_stream_async if self.protocol == "grpc" else http_stream_async
        return retried_start_async(lambda: run(self.url, self.timeout_s, task, text, options), self.retry)

    def chat(self, task: str, request: Mapping[str, Any] | str) -> AsyncIterator[ChatChunk]:
        """A chat model's answer to a chat request (clients/chat.py), streamed with why it ended and its token
        counts (gRPC only); a failure before the first piece is retried as `stream` retries."""
        if self.protocol != "grpc":
            raise ValueError("chat streams over gRPC only")
        return retried_start_async(lambda: chat_stream_async(self.url, self.timeout_s, task, request), self.retry)

    async def is_ready(self, task: str | None = None) -> bool:
        """Whether the server (and `task`'s model, if named) can take requests; False rather than raise."""
        model = None if task is None else _model_for(task)
        try:
            with self._errors():
                if model is None:
                    return bool(await self._triton().is_server_ready(**self._call_kwargs))
                return bool(await self._triton().is_model_ready(model, **self._call_kwargs))
        except ClientError:
            return False

    async def close(self) -> None:
        for closing in list(self._closing):
            closing.cancel()  # _close_later closes its connection now
        await asyncio.gather(*self._closing, return_exceptions=True)
        if self._opened is not None:
            opened, self._opened = self._opened, None
            await opened.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _triton(self) -> Any:
        if self._opened is None:
            self._opened = self.transport.open(self.url, self.timeout_s, asynchronous=True)
        return self._opened

    async def _infer(self, endpoint: Endpoint[T], texts: Texts, options: Mapping[str, int | str | None]) -> list[T]:
        request = self._prepare(endpoint, texts, options)

        async def attempt() -> Any:
            try:
                with self._errors():
                    return await self._triton().infer(
                        request.model, request.inputs, outputs=request.outputs, **self._call_kwargs
                    )
            except ClientError as error:
                if RetryPolicy.reconnects(error) and self._opened is not None:
                    # the next attempt opens a new connection; coroutines still using the old one finish on it
                    old, self._opened = self._opened, None
                    closing = asyncio.ensure_future(_close_later(old, self.timeout_s))
                    self._closing.add(closing)
                    closing.add_done_callback(self._closing.discard)
                raise

        return endpoint.decode(await call_with_retry_async(attempt, self.retry), request.rows)


async def _close_later(connection: Any, after_s: float) -> None:
    """Close a connection that a reconnect replaced once its last request has timed out at the latest."""
    try:
        await asyncio.sleep(after_s)
    finally:
        await connection.close()
