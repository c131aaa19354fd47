"""A request-size guard in front of Triton's HTTP port.

Triton 2.51 has no request-size setting, and one HTTP request whose JSON part is larger than about 4 MB kills
the whole server with a segmentation fault when it comes with `curl -d`'s content type,
application/x-www-form-urlencoded (measured: 3,900 KiB answered, 4,200 KiB crashed it;
binary-tensor requests and gRPC are not affected). The launcher therefore puts this guard on the public HTTP
port and moves Triton's own HTTP endpoint to a private loopback port. The guard reads each request's head,
refuses one whose JSON part is over the limit with ``413`` and a JSON error (Triton's error format), refuses a
chunked body (``411``: Triton's clients and curl send Content-Length), and otherwise passes bytes through
untouched in both directions. Keep-alive connections are followed request by request.

The JSON part is the whole body, or its first ``Inference-Header-Content-Length`` bytes when the request uses
Triton's binary tensor extension (the tensors after it are not parsed as JSON, so they may be large).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading

DEFAULT_MAX_JSON_BYTES = 2 << 20  # half the measured crash size; 2 MiB of JSON holds ~64 texts of 10k characters
LINGER_S = 5.0  # how long a refused client may go on sending its body before the connection closes
BINARY_HEADER = "inference-header-content-length"


class HeadError(Exception):
    """A request head the guard refuses; ``status`` and the message go back to the client."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_head(head: bytes) -> dict[str, str]:
    """Lower-cased header names → values of an HTTP/1.x request head (the request line is skipped)."""
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise HeadError("400 Bad Request", f"malformed header line {line[:60]!r}")
        headers[name.strip().lower()] = value.strip()
    return headers


def body_length(headers: dict[str, str], max_json_bytes: int) -> int:
    """Bytes of body that follow the head; raises :class:`HeadError` for what the guard refuses."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HeadError("411 Length Required", "chunked request bodies are not accepted: send Content-Length")
    try:
        length = int(headers.get("content-length", "0"))
        json_part = int(headers.get(BINARY_HEADER, length))
    except ValueError:
        raise HeadError("400 Bad Request", "Content-Length must be an integer") from None
    if json_part > max_json_bytes:
        raise HeadError(
            "413 Payload Too Large",
            f"the request's JSON is {json_part:,} bytes; the limit is {max_json_bytes:,} bytes "
            "(send fewer texts per request, use the binary tensor extension, or gRPC)",
        )
    return length


def error_response(error: HeadError) -> bytes:
    body = json.dumps({"error": str(error)}).encode()
    head = (
        f"HTTP/1.1 {error.status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy Triton's answers to the client until Triton closes; then close the client side too."""
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        return
    writer.close()


class HttpGuard:
    """Listen on ``host:port``, forward to Triton's HTTP endpoint at ``upstream`` (host, port)."""

    def __init__(
        self, host: str, port: int, upstream: tuple[str, int], max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
    ) -> None:
        self.host, self.port, self.upstream, self.max_json_bytes = host, port, upstream, max_json_bytes
        self.refused = 0  # requests answered 411/413/400 by the guard itself
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="ropeserve-http-guard", daemon=True)

    def start(self) -> HttpGuard:
        """Bind (raising OSError if the port is taken) and serve from a background thread."""
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, self.host, self.port, reuse_address=True)
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return

        async def close() -> None:
            self._server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._loop.close()
        self._server = None

    async def _connection(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # the guard is stopping
            await self._serve(client_reader, client_writer)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.close()
            return
        responses = asyncio.create_task(_pipe(up_reader, client_writer))
        try:
            await self._forward_requests(client_reader, up_writer)
            with contextlib.suppress(OSError):
                up_writer.write_eof()  # the client is done: let Triton finish its last answer and close
            await asyncio.wait({responses}, timeout=30)
        except HeadError as error:
            self.refused += 1
            responses.cancel()
            with contextlib.suppress(ConnectionError):
                client_writer.write(error_response(error))
                await client_writer.drain()
                # Read what the client still sends (up to a few seconds), so it gets to read the answer.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(_discard(client_reader), timeout=LINGER_S)
        except ConnectionError:
            pass  # the client went away
        finally:
            responses.cancel()
            for writer in (up_writer, client_writer):
                with contextlib.suppress(Exception):
                    writer.close()

    async def _forward_requests(self, client_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
        """Pass requests through one by one until the client closes; raise HeadError for one to refuse."""
        while True:
            try:
                head = await client_reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError:
                raise HeadError("431 Request Header Fields Too Large", "the request head is too large") from None
            except asyncio.IncompleteReadError:
                return  # the client closed the connection
            remaining = body_length(parse_head(head), self.max_json_bytes)
            up_writer.write(head)
            while remaining > 0:
                chunk = await client_reader.read(min(remaining, 1 << 16))
                if not chunk:
                    return
                up_writer.write(chunk)
                remaining -= len(chunk)
                await up_writer.drain()
            await up_writer.drain()


async def _discard(reader: asyncio.StreamReader) -> None:
    while await reader.read(1 << 16):
        pass
