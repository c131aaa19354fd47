"""Streamed answers: the pieces of one text's answer as the server produces them, from `<task>_stream`.

A task whose definition has a `[stream]` table has a decoupled twin, `<task>_stream`, with the same inputs: it
answers with a stream of responses, each holding the text that became certain since the last one, the last one
flagged final. Joined, the pieces equal the endpoint's non-streamed answer for the same settings.

- gRPC: one bidirectional stream per call (tritonclient's `start_stream` / `async_stream_infer`), ended by closing
  our side of it and never by cancelling the call: Triton 2.51 mishandles cancelled streams (see `_end_stream`).
- HTTP: Triton's `generate_stream` extension, server-sent events (``data: {...}`` lines):

      curl -N localhost:8000/v2/models/translate_stream/generate_stream -d '{"TEXT": "我爱你。", "NUM_BEAMS": 1}'

Greedy decoding streams token by token; beam search can only stream what all its beams agree on, which often is
the whole answer at the end.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, TypeVar

from numpy.typing import NDArray

from .endpoints import option_tensor, options_of, text_tensor, to_infer_input
from .errors import BAD_RESPONSE, DEADLINE_EXCEEDED, ClientError, stream_error, translated_errors
from .retry import RetryPolicy, call_with_retry, call_with_retry_async
from .task_definitions import Option
from .task_definitions import get as get_task

FINAL = "triton_final_response"
T = TypeVar("T")


def stream_model(task: str) -> tuple[str, str, Mapping[str, Option]]:
    """(the streaming twin's name, its text output, keyword -> option) for `task`."""
    definition = get_task(task)
    if definition.stream is None:
        raise ValueError(f"{task} has no streaming twin (its definition has no [stream] table)")
    return definition.stream.name, definition.stream.outputs[0].name, options_of(definition)


def _inputs(text: str, options: Mapping[str, int | str | None], known: Mapping[str, Option]) -> dict[str, NDArray[Any]]:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    unknown = set(options) - set(known)
    if unknown:
        raise TypeError(f"does not take {', '.join(sorted(unknown))}")
    tensors = {"TEXT": text_tensor([text])}
    for keyword, value in options.items():
        if value is not None:
            tensors[known[keyword].input] = option_tensor(known[keyword], value, 1)
    return tensors


def _grpc_inputs(
    module: Any, text: str, options: Mapping[str, int | str | None], known: Mapping[str, Option]
) -> list[Any]:
    return [to_infer_input(name, array, module.InferInput) for name, array in _inputs(text, options, known).items()]


def retried_start(open_stream: Callable[[], Iterator[str]], policy: RetryPolicy) -> Iterator[str]:
    """The stream `open_stream` opens, opened again per `policy` while it fails before its first piece: until then
    the caller has seen nothing, so a second try repeats nothing. Each try opens its own connection."""

    def first_piece() -> tuple[Iterator[str], str | None]:
        pieces = open_stream()
        return pieces, next(pieces, None)

    pieces, piece = call_with_retry(first_piece, policy)
    if piece is not None:
        yield piece
        yield from pieces


async def retried_start_async(open_stream: Callable[[], AsyncIterator[T]], policy: RetryPolicy) -> AsyncIterator[T]:
    """`retried_start` for async streams (of pieces, or a chat's chunks)."""

    async def first_piece() -> tuple[AsyncIterator[T], T | None]:
        pieces = open_stream()
        return pieces, await anext(pieces, None)

    pieces, piece = await call_with_retry_async(first_piece, policy)
    if piece is not None:
        yield piece
        async for piece in pieces:
            yield piece


def grpc_stream(
    url: str, timeout_s: float, task: str, text: str, options: Mapping[str, int | str | None]
) -> Iterator[str]:
    import tritonclient.grpc as grpcclient

    model, output, known = stream_model(task)
    inputs = _grpc_inputs(grpcclient, text, options, known)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    finished = False
    try:
        with translated_errors(url, timeout_s):
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            try:
                result, error = answers.get(timeout=timeout_s)
            except queue.Empty:
                raise ClientError(f"no response from {model} within {timeout_s:g} s", DEADLINE_EXCEEDED, url) from None
            if error is not None:
                raise stream_error(error, url, timeout_s) or error
            piece = result.as_numpy(output)
            if piece is not None and piece.size:
                yield piece.reshape(-1)[0].decode("utf-8")
            if result.get_response().parameters[FINAL].bool_param:
                finished = True
                return
    finally:
        _end_stream(client, finished)


def _end_stream(client: Any, finished: bool) -> None:
    """Close a gRPC stream without cancelling it.

    Triton 2.51's gRPC frontend mishandles a cancelled stream (fixed upstream in later releases; measured in
    docs/reliability.md): a stream cancelled after its final response leaves ~1.3 KB behind in the server and keeps
    the model from unloading at shutdown, and streams cancelled mid-answer crash the server within a minute of a
    few clients doing it. So a finished stream is closed from our side (the server ends the call), and a caller that
    stops early (a `break`, a timeout) leaves the rest of the answer to a background thread that reads and drops it:
    the server spends the remaining steps, and nothing is cancelled."""
    if finished:
        client.close()
    else:
        threading.Thread(target=client.close, name="ropeserve-stream-drain", daemon=True).start()


async def grpc_stream_async(
    url: str, timeout_s: float, task: str, text: str, options: Mapping[str, int | str | None]
) -> AsyncIterator[str]:
    """:func:`grpc_stream` on asyncio (:func:`grpc_responses_async`)."""
    import tritonclient.grpc.aio as grpcaio

    model, output, known = stream_model(task)
    async for result in grpc_responses_async(url, timeout_s, model, _grpc_inputs(grpcaio, text, options, known)):
        piece = result.as_numpy(output)
        if piece is not None and piece.size and piece.reshape(-1)[0]:
            yield piece.reshape(-1)[0].decode("utf-8")


async def grpc_responses_async(url: str, timeout_s: float, model: str, inputs: list[Any]) -> AsyncIterator[Any]:
    """Every response (an InferResult) of one request to a decoupled `model`. The request goes out and our side
    of the stream closes at once: Triton ends the call after the request's last response, which is how the end
    is seen (tritonclient's asyncio client cannot ask for an empty final response). The responses are read by a
    task of their own, to the end, whatever the caller does: a caller that stops early or is cancelled never
    cancels the call, for the reason :func:`_end_stream` gives."""
    import tritonclient.grpc.aio as grpcaio

    request = {"model_name": model, "inputs": inputs}

    async def one_request() -> AsyncIterator[dict[str, Any]]:
        yield request

    client = grpcaio.InferenceServerClient(url)
    received: asyncio.Queue[tuple[Any, BaseException | None] | None] = asyncio.Queue()
    with translated_errors(url, timeout_s):
        responses = client.stream_infer(one_request())
    reader = asyncio.ensure_future(_read_to_end(client, responses, received))
    _READING.add(reader)
    reader.add_done_callback(_READING.discard)
    while True:
        try:
            item = await asyncio.wait_for(received.get(), timeout_s)
        except TimeoutError:
            raise ClientError(f"no response from {model} within {timeout_s:g} s", DEADLINE_EXCEEDED, url) from None
        if item is None:
            return
        result, error = item
        if error is not None:
            raise stream_error(error, url, timeout_s) or error
        yield result


_READING: set[asyncio.Future[None]] = set()  # asyncio keeps only weak references to tasks


async def _read_to_end(client: Any, responses: Any, received: asyncio.Queue[Any]) -> None:
    """Every response of one stream into ``received``, then None; the client closes after the last."""
    try:
        async for item in responses:
            received.put_nowait(item)
    except Exception as error:  # a transport failure ends the stream: the reader raises it
        received.put_nowait((None, error))
    finally:
        received.put_nowait(None)
        await client.close()


async def http_stream_async(
    url: str, timeout_s: float, task: str, text: str, options: Mapping[str, int | str | None]
) -> AsyncIterator[str]:
    """:func:`http_stream` on asyncio (aiohttp, which tritonclient's asyncio HTTP client already needs)."""
    import aiohttp

    model, output, body = _http_body(task, text, options)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
    with translated_errors(url, timeout_s):
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.post(f"http://{url}/v2/models/{model}/generate_stream", json=body) as response:
                if response.status != 200:
                    raise ClientError(_error_text(await response.read()), str(response.status), url)
                async for line in response.content:
                    piece = _sse_piece(line, output, url)
                    if piece:
                        yield piece


def _http_body(task: str, text: str, options: Mapping[str, int | str | None]) -> tuple[str, str, dict[str, Any]]:
    """(the streaming twin, its text output, the generate_stream JSON body) for one text."""
    model, output, known = stream_model(task)
    body = {name: array.reshape(-1)[0] for name, array in _inputs(text, options, known).items()}
    body = {name: value.decode("utf-8") if isinstance(value, bytes) else int(value) for name, value in body.items()}
    return model, output, body


def _sse_piece(line: bytes, output: str, url: str) -> str | None:
    """The text of one server-sent event line of generate_stream; None for a line that is not an event."""
    if not line.startswith(b"data:"):
        return None
    event = json.loads(line[len(b"data:") :])
    if "error" in event:
        raise ClientError(event["error"], "400", url)
    if not isinstance(event.get(output), str):
        raise ClientError(f"a streamed event has no text {output}: {event}", BAD_RESPONSE, url)
    return str(event[output])


def http_stream(
    url: str, timeout_s: float, task: str, text: str, options: Mapping[str, int | str | None]
) -> Iterator[str]:
    model, output, body = _http_body(task, text, options)
    request = urllib.request.Request(
        f"http://{url}/v2/models/{model}/generate_stream",
        data=json.dumps(body).encode("utf-8"),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        response = urllib.request.urlopen(request, timeout=timeout_s)  # noqa: S310 - the URL is the caller's server
    except urllib.error.HTTPError as error:
        raise ClientError(_error_text(error.read()), str(error.code), url) from None
    except OSError as error:
        with translated_errors(url, timeout_s):
            raise error
    with response:
        for line in response:
            piece = _sse_piece(line, output, url)
            if piece:
                yield piece


def _error_text(body: bytes) -> str:
    """The message of an error answer, plain JSON or a server-sent event (``data: {"error": ...}``)."""
    body = body.strip()
    if body.startswith(b"data:"):
        body = body[len(b"data:") :]
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", "replace")
