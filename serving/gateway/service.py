"""What the routes ask of Triton, in one place: answers, streams and explanations through the SDK's
`AsyncClient` (gRPC), Triton's errors turned into the gateway's, and the source language guessed."""

from __future__ import annotations

import asyncio
import functools
import unicodedata
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from typing import Any

from clients import AsyncClient, ClientError, RetryPolicy
from clients.task_definitions import get as get_task
from serving.frontends.sentences import split

from .errors import GatewayError, from_client_error
from .html_text import translate_html

Options = Mapping[str, int | str | None]
# Requests of one task with the same options that wait together go to Triton as one request, up to this many
# rows, while this many of that task's requests are in flight (below, every request goes at once): under load one
# gRPC call then carries many texts, which saves the gateway's and Triton's per-request work.
COALESCE_ROWS = 64
COALESCE_IN_FLIGHT = 4
# Sentences of one streamed text decoded at once: the engine batches them, and a long document must not fill
# the streaming twin's queue (64 requests) alone.
STREAM_SENTENCES_IN_FLIGHT = 8


class TranslatorError(ValueError):
    """A task that cannot stand behind DeepL's and LibreTranslate's APIs."""


def check_translator(task: str) -> None:
    """`task` exists and answers TRANSLATION for each text (the built-in translate's contract); else
    TranslatorError says why."""
    try:
        definition = get_task(task)
    except ValueError as error:
        raise TranslatorError(str(error)) from None
    answers = definition.endpoint.outputs[0].name
    if answers != "TRANSLATION" or len(definition.endpoint.outputs) != 1:
        raise TranslatorError(f"{task} answers {answers}, not TRANSLATION: it is not a translator")
    if not any(option.keyword == "split_sentences" for option in definition.options):
        raise TranslatorError(f"{task} has no split_sentences option, which DeepL's API sets")


class Triton:
    """The models behind the gateway, reached over gRPC. One per app; `close` it at shutdown. `translator`: the
    task DeepL's and LibreTranslate's APIs call."""

    def __init__(self, url: str, timeout_s: float, translator: str = "translate") -> None:
        self.translator = translator
        # Two tries: a restarting server is bridged, an overloaded one answers the client quickly with 503.
        self.client = AsyncClient(url, protocol="grpc", timeout_s=timeout_s, retry=RetryPolicy(max_attempts=2))
        self._coalescers: dict[tuple[str, tuple[tuple[str, Any], ...]], Coalescer] = {}

    async def close(self) -> None:
        await self.client.close()

    async def answers(self, task: str, texts: Sequence[str], options: Options) -> list[Any]:
        """`task`'s answer per text. A generation task (one with ``max_new_tokens``) gets each text as its own
        request, sent together: Triton answers a request when its slowest text is done, and a request's row limit
        (sentences × beams) then bounds one text. Other tasks, whose texts cost about the same, are coalesced."""
        try:
            if _generates(task):
                results = await asyncio.gather(*(self.client.infer(task, [text], **options) for text in texts))
                return [jsonable(result[0]) for result in results]
            key = (task, tuple(sorted(options.items())))
            if key not in self._coalescers:
                self._coalescers[key] = Coalescer(lambda batch: self.client.infer(task, batch, **options))
            return [jsonable(result) for result in await self._coalescers[key].answer(list(texts))]
        except ClientError as error:
            raise from_client_error(error) from None

    async def translate(self, texts: Sequence[str], options: Options, html: bool = False) -> list[str]:
        """The translator's answers (DeepL's and LibreTranslate's routes)."""
        if not html:
            return await self.answers(self.translator, texts, options)

        async def runs(pieces: Sequence[str]) -> list[str]:
            return await self.answers(self.translator, pieces, options)

        return list(await asyncio.gather(*(translate_html(text, runs) for text in texts)))

    async def explain(self, task: str, text: str) -> dict[str, Any]:
        try:
            [answer] = await self.client.explain(task, [text])
        except ClientError as error:
            raise from_client_error(error) from None
        return jsonable(answer)

    async def stream(self, task: str, text: str, options: Options) -> AsyncIterator[dict[str, Any]]:
        """A text's answer as events: ``{"sentences": [...]}`` first (the pieces it is read as), then
        ``{"sentence": i, "text": ...}`` and ``{"separator": ...}`` in order; their texts and separators joined
        equal `answers`' answer. A task with a ``split_sentences`` option is split here the way its model
        splits, and its sentences decoded at once, each streamed by the model; any other text is one piece."""
        definition = get_task(task)
        if definition.stream is None:
            raise GatewayError(404, f"{task} does not stream")
        splits = any(option.keyword == "split_sentences" for option in definition.options)
        mode = str(options.get("split_sentences") or "1") if splits else "0"
        document = split(text, mode) if text.strip() else split(text, "0")
        yield {"sentences": list(document.pieces)}
        queues: list[asyncio.Queue[Any]] = [asyncio.Queue() for _ in document.pieces]
        slots = asyncio.Semaphore(STREAM_SENTENCES_IN_FLIGHT)

        async def decode(i: int) -> None:
            async with slots:
                try:
                    async for piece in self.client.stream(task, document.pieces[i], **options):
                        queues[i].put_nowait(piece)
                    queues[i].put_nowait(None)
                except ClientError as error:
                    queues[i].put_nowait(from_client_error(error))

        workers = [asyncio.ensure_future(decode(i)) for i in range(len(document.pieces))]
        try:
            for i, queue in enumerate(queues):
                if document.separator(i):
                    yield {"separator": document.separator(i)}
                while (item := await queue.get()) is not None:
                    if isinstance(item, GatewayError):
                        raise item
                    yield {"sentence": i, "text": item}
            if document.separator(len(queues)):
                yield {"separator": document.separator(len(queues))}
        finally:
            for worker in workers:
                worker.cancel()  # a sentence not started yet is dropped; a started one is read to its end


class Coalescer:
    """One task's requests, sent while few are in flight, else gathered until one returns.

    A request is sent one event-loop turn after it arrives, not at once: the requests whose bodies were read in
    the same turn then leave as one gRPC call, which saves Triton's and the gateway's per-call work under load,
    at the cost of one turn (microseconds).
    """

    def __init__(self, send: Callable[[list[str]], Awaitable[list[Any]]]) -> None:
        self._send = send
        self._waiting: list[tuple[list[str], asyncio.Future[list[Any]]]] = []
        self._in_flight = 0
        self._dispatch_soon = False

    async def answer(self, texts: list[str]) -> list[Any]:
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiting.append((texts, future))
        if self._in_flight < COALESCE_IN_FLIGHT and not self._dispatch_soon:
            self._dispatch_soon = True
            asyncio.get_running_loop().call_soon(self._dispatch_now)
        return await future

    def _dispatch_now(self) -> None:
        self._dispatch_soon = False
        self._dispatch()

    def _dispatch(self) -> None:
        while self._waiting and self._in_flight < COALESCE_IN_FLIGHT:
            batch: list[tuple[list[str], asyncio.Future[list[Any]]]] = []
            rows = 0
            while self._waiting and (not batch or rows + len(self._waiting[0][0]) <= COALESCE_ROWS):
                texts, future = self._waiting.pop(0)
                batch.append((texts, future))
                rows += len(texts)
            self._in_flight += 1
            _SENDING.add(task := asyncio.ensure_future(self._run(batch)))
            task.add_done_callback(_SENDING.discard)

    async def _run(self, batch: list[tuple[list[str], asyncio.Future[list[Any]]]]) -> None:
        try:
            await self._answer(batch)
        finally:
            self._in_flight -= 1
            self._dispatch()

    async def _answer(self, batch: list[tuple[list[str], asyncio.Future[list[Any]]]]) -> None:
        try:
            results = await self._send([text for texts, _ in batch for text in texts])
        except Exception as error:  # every waiting client gets the failure; none waits forever
            if len(batch) > 1 and isinstance(error, ClientError) and from_client_error(error).status == 400:
                # one request's bad text refused them all: each again alone, so only that one fails
                await asyncio.gather(*(self._answer([request]) for request in batch))
                return
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        start = 0
        for texts, future in batch:
            if not future.done():  # its client may have gone
                future.set_result(results[start : start + len(texts)])
            start += len(texts)


_SENDING: set[asyncio.Future[None]] = set()  # asyncio keeps only weak references to tasks


@functools.cache
def _generates(task: str) -> bool:
    return any(option.keyword == "max_new_tokens" for option in get_task(task).options)


def jsonable(value: Any) -> Any:
    """An SDK result as JSON: dataclasses as objects, numpy arrays as nested lists."""
    if is_dataclass(value) and not isinstance(value, type):
        return {name: jsonable(item) for name, item in asdict(value).items()}
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return value


def detect_language(text: str) -> list[dict[str, Any]]:
    """LibreTranslate's ``/detect``: Chinese (the one source language) and English by their share of the
    text's letters, the likelier first, confidence in percent."""
    letters = [c for c in text if unicodedata.category(c).startswith("L")]
    if not letters:
        return [{"language": "zh", "confidence": 0.0}]
    han = sum("CJK" in unicodedata.name(c, "") for c in letters)
    latin = sum("LATIN" in unicodedata.name(c, "") for c in letters)
    found = [("zh", han), ("en", latin)]
    found.sort(key=lambda pair: -pair[1])
    guesses = [{"language": code, "confidence": round(100 * n / len(letters), 1)} for code, n in found if n]
    return guesses or [{"language": "zh", "confidence": 0.0}]
