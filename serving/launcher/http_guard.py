"""A strict HTTP/1.1 front for Triton's HTTP port: what Triton 2.51 would crash on never reaches it.

Why: Triton 2.51 has no request-size setting, and its HTTP library (libevhtp) parses the body of any request whose
Content-Type starts with ``application/x-www-form-urlencoded`` (what ``curl -d`` and urllib send) as a query
string, on the stack: two buffers of the body's length. A body over about 4 MB overflows the 8 MiB thread stack and
the whole server dies with SIGSEGV. Measured on the embedded server without this guard (sentiment model; "answered"
means an HTTP answer, here 400 for a text over 1 MiB or 200):

- JSON of 3.0 MB: answered as a form, as ``application/json`` and with no content type;
- JSON as a form: 3,900 KiB answered; 4,200 KiB and 8.4 MB SIGSEGV, with or without an
  ``Inference-Header-Content-Length: 10`` header;
- JSON of 8.4, 32 and 64 MB as ``application/json`` or with no content type: answered;
- binary tensors of 6.7 MB (32 x 70,000 CJK characters): answered with no content type or
  ``application/octet-stream``, SIGSEGV as a form; 1.9 MB as a form: answered;
- ``Content-Encoding: gzip``, 1.0 MB inflating to 1 GiB of JSON: answered after 19 s, Triton's peak RSS 4.5 GB.

So the launcher puts this guard on the public HTTP port and moves Triton's HTTP endpoint to a private loopback
port. The guard reads each request head and

- caps the *whole* body at ``max_body_bytes`` (413), whatever other headers say. 2 MiB is half the crash size, so
  even a form body could not crash Triton; one cap for JSON and binary-tensor bodies;
- refuses what it cannot read one way only (400): a malformed request line, header lines with bare CR/LF, control
  characters or obs-fold, a space before the colon, duplicate Content-Length/Transfer-Encoding/Content-Type/
  Content-Encoding/Inference-Header-Content-Length/Host, a Content-Length or Inference-Header-Content-Length that
  is not plain decimal digits, and an Inference-Header-Content-Length larger than the body;
- wants a length: POST/PUT/PATCH without Content-Length, and any Transfer-Encoding (chunked included), get 411;
- refuses compressed bodies (415): their inflated size is unknown until inflated (see the gzip measurement);
- forwards a head it wrote itself from the parsed fields, never the client's bytes, so Triton's parser cannot
  read a request differently from the guard; in it a form Content-Type becomes ``application/json`` (Triton reads
  the body as JSON either way, so ``curl -d`` keeps working, and libevhtp never parses a body as a form). Request
  heads are capped at 64 KiB (431), which also bounds libevhtp's parse of the URL's query string.

The head grammar is RFC 9112's, strict and small. A library parser (h11) would still leave the guard to write the
head it forwards and to pass Triton's answers through, which is most of this module.

Bodies pass through unchanged, and Triton's answers come back byte for byte; keep-alive connections are followed
request by request. An answer of the guard's own (an error, or 503 from the ``liveness`` hook) comes after
Triton's answers to the connection's earlier requests, and then the connection closes. While Triton is not
listening (starting, restarting), a connection is closed without an answer, as if nothing listened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_MAX_BODY_BYTES = 2 << 20  # half the measured crash size; 2 MiB of JSON holds ~64 texts of 10k characters
MAX_HEAD_BYTES = 64 << 10
LINGER_S = 5.0  # how long a refused client may go on sending its body before the connection closes
DRAIN_S = 30.0  # how long the guard's own answer waits for Triton's answers to the requests before it
LIVENESS_PATH = "/v2/health/live"
FORM = "application/x-www-form-urlencoded"
BINARY_HEADER = "inference-header-content-length"
SINGLE_HEADERS = {"content-length", "transfer-encoding", "content-type", "content-encoding", BINARY_HEADER, "host"}
BODY_METHODS = {"POST", "PUT", "PATCH"}

_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_REQUEST_LINE = re.compile(rf"({_TOKEN}) ([\x21-\x7e]+) (HTTP/1\.[01])")
_HEADER = re.compile(rf"({_TOKEN}):[ \t]*(.*?)[ \t]*")
_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")  # visible characters, space, tab; no control characters
_DECIMAL = re.compile(r"[0-9]{1,18}")  # 18 digits hold any real length and keep int() cheap


class HeadError(Exception):
    """A request the guard answers itself; ``status`` and the message go back to the client."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def _bad(message: str) -> HeadError:
    return HeadError("400 Bad Request", message)


@dataclass
class Request:
    """A request head as the guard understood it; :attr:`head` is what Triton gets."""

    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]  # names as sent, values without surrounding blanks
    body_length: int

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def head(self) -> bytes:
        lines = [f"{self.method} {self.target} {self.version}"] + [f"{name}: {value}" for name, value in self.headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_request(head: bytes, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Request:
    """Parse one request head (ending in a blank line) by the rules in the module docstring.

    Raises :class:`HeadError` for a request the guard refuses.
    """
    lines = head.decode("latin-1").removesuffix("\r\n\r\n").split("\r\n")
    request_line = _REQUEST_LINE.fullmatch(lines[0])
    if request_line is None:
        raise _bad(f"malformed request line {lines[0][:80]!r}")
    method, target, version = request_line.groups()
    headers: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):
            raise _bad("folded header lines (obs-fold) are not accepted")
        field = _HEADER.fullmatch(line)
        if field is None or not _VALUE.fullmatch(field.group(2)):
            raise _bad(f"malformed header line {line[:80]!r}")
        name, value = field.groups()
        key = name.lower()
        if key in seen and key in SINGLE_HEADERS:
            raise _bad(f"duplicate {name} header")
        seen[key] = value
        if key == "content-type" and value.lower().startswith(FORM):
            value = "application/json"  # libevhtp would parse the body as a form, on its stack
        headers.append((name, value))

    if "transfer-encoding" in seen:
        raise HeadError("411 Length Required", "Transfer-Encoding (chunked too) is not accepted: send Content-Length")
    if "content-encoding" in seen:
        raise HeadError(
            "415 Unsupported Media Type", "compressed request bodies are not accepted: their inflated size is unknown"
        )
    if "content-length" not in seen:
        if method in BODY_METHODS:
            raise HeadError("411 Length Required", f"a {method} request needs a Content-Length header")
        length = 0
    else:
        length = _length(seen["content-length"], "Content-Length")
        headers = [(n, str(length) if n.lower() == "content-length" else v) for n, v in headers]
    if length > max_body_bytes:
        raise HeadError(
            "413 Payload Too Large",
            f"the request body is {length:,} bytes; the limit is {max_body_bytes:,} bytes "
            "(send fewer texts per request, or use gRPC)",
        )
    if BINARY_HEADER in seen and _length(seen[BINARY_HEADER], "Inference-Header-Content-Length") > length:
        raise _bad("Inference-Header-Content-Length is larger than the body")
    return Request(method, target, version, headers, length)


def _length(value: str, name: str) -> int:
    if not _DECIMAL.fullmatch(value):
        raise _bad(f"{name} must be a decimal number of bytes, not {value[:30]!r}")
    return int(value)


def answer(status: str, message: str) -> bytes:
    """A complete response in Triton's error format; the connection closes after it."""
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


class HttpGuard:
    """Listen on ``host:port``, forward to Triton's HTTP endpoint at ``upstream`` (host, port).

    ``liveness``: called for each ``GET /v2/health/live``; a string it returns (the reason) is answered with
    ``503`` and ``{"error": reason}`` instead of Triton's answer. It runs on the guard's event loop, so it must be
    cheap and must not block (read a flag that another thread keeps up to date). An exception counts as a reason.
    """

    def __init__(
        self,
        host: str,
        port: int,
        upstream: tuple[str, int],
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        *,
        liveness: Callable[[], str | None] | None = None,
    ) -> None:
        self.host, self.port, self.upstream, self.max_body_bytes = host, port, upstream, max_body_bytes
        self.liveness = liveness
        self.refused = 0  # requests answered 400/411/413/415/431 by the guard itself
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="ropeserve-http-guard", daemon=True)

    def start(self) -> HttpGuard:
        """Bind (raising OSError if the port is taken) and serve from a background thread."""
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, self.host, self.port, reuse_address=True, limit=MAX_HEAD_BYTES)
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

    def _not_live(self, request: Request) -> str | None:
        if self.liveness is None or request.method != "GET" or request.path != LIVENESS_PATH:
            return None
        try:
            return self.liveness()
        except Exception as exc:  # a broken check cannot vouch for the server
            return f"the liveness check failed: {exc!r}"

    async def _connection(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # the guard is stopping
            await self._serve(client_reader, client_writer)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        """Forward requests one by one until the client closes or the guard answers one itself."""
        upstream: asyncio.StreamWriter | None = None
        responses: asyncio.Task | None = None
        reply: bytes | None = None  # the guard's own answer
        answering = asyncio.Event()  # set once the guard has an answer of its own to send after Triton's
        try:
            while reply is None:
                try:
                    request = await self._read_request(client_reader)
                except HeadError as error:
                    self.refused += 1
                    reply = answer(error.status, str(error))
                    break
                if request is None:
                    break  # the client closed the connection
                if (reason := self._not_live(request)) is not None:
                    reply = answer("503 Service Unavailable", reason)
                    break
                if upstream is None:
                    try:
                        up_reader, upstream = await asyncio.open_connection(*self.upstream)
                    except OSError:  # Triton is starting or restarting: no answer, as if nothing listened,
                        break  # which is what the launcher's readiness polling waits through
                    responses = asyncio.create_task(_pipe(up_reader, client_writer, answering))
                upstream.write(request.head)
                if not await _copy(client_reader, upstream, request.body_length):
                    break  # the client closed in the middle of a body
            if reply is not None:
                answering.set()
            if upstream is not None:
                with contextlib.suppress(OSError):
                    upstream.write_eof()  # Triton answers what it has received, then closes
                await asyncio.wait({responses}, timeout=DRAIN_S)
            if reply is not None:
                client_writer.write(reply)
                await client_writer.drain()
                client_writer.write_eof()
                # Read what the client still sends (a refused body, for a few seconds): closing with unread data
                # would reset the connection, and the client might lose the answer.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(_discard(client_reader), timeout=LINGER_S)
        except ConnectionError:
            pass  # the client or Triton went away
        finally:
            if responses is not None:
                responses.cancel()
            for writer in (upstream, client_writer):
                if writer is not None:
                    with contextlib.suppress(Exception):
                        writer.close()

    async def _read_request(self, reader: asyncio.StreamReader) -> Request | None:
        """The next request, None once the client has closed; raises :class:`HeadError` for one to refuse."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        except asyncio.LimitOverrunError:
            raise HeadError("431 Request Header Fields Too Large", "the request head is over 64 KiB") from None
        return parse_request(head, self.max_body_bytes)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answering: asyncio.Event) -> None:
    """Copy Triton's answers to the client until Triton closes its side. When Triton closed by itself (HTTP/1.0,
    ``Connection: close``), close the client's connection too, unless the guard is ``answering`` after Triton."""
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    if not answering.is_set():
        writer.close()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, length: int) -> bool:
    """Copy ``length`` bytes of body; False if the client closed before sending them all."""
    while length > 0:
        chunk = await reader.read(min(length, 1 << 16))
        if not chunk:
            return False
        writer.write(chunk)
        length -= len(chunk)
        await writer.drain()
    return True


async def _discard(reader: asyncio.StreamReader) -> None:
    while await reader.read(1 << 16):
        pass
