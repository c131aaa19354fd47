"""One exception type for everything that can go wrong between the caller and Triton.

tritonclient raises different things per transport: `InferenceServerException` for gRPC and for HTTP error
responses, but plain `OSError`/`TimeoutError` (geventhttpclient) or aiohttp exceptions when the HTTP
connection itself fails. Callers should not have to know which transport they picked, so all of it
becomes `ClientError`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum

from tritonclient.utils import InferenceServerException

UNREACHABLE = "UNREACHABLE"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
BAD_RESPONSE = "BAD_RESPONSE"


class Status(str, Enum):  # noqa: UP042 - StrEnum is Python 3.11+, and the SDK runs on 3.10
    """Why a request failed, the same whichever transport carried it (`ClientError.code`): gRPC's names, and
    three of ours for failures that never produced a server answer."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"  # bad input: fix the request (HTTP 400, 411, 413, 415, 431)
    NOT_FOUND = "NOT_FOUND"  # no such model, or it is unloaded (HTTP 404)
    UNAVAILABLE = "UNAVAILABLE"  # overloaded or not ready yet: try again (HTTP 502, 503)
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"  # a rate or quota limit (HTTP 429)
    INTERNAL = "INTERNAL"  # the server failed (HTTP 500)
    DEADLINE_EXCEEDED = DEADLINE_EXCEEDED  # no answer in time (HTTP 504)
    CANCELLED = "CANCELLED"
    UNREACHABLE = UNREACHABLE  # nothing answered at the address
    BAD_RESPONSE = BAD_RESPONSE  # an answer that breaks the task's contract
    UNKNOWN = "UNKNOWN"  # anything else; `ClientError.status` has the transport's own words


HTTP_CODES = {
    400: Status.INVALID_ARGUMENT,
    404: Status.NOT_FOUND,
    411: Status.INVALID_ARGUMENT,
    413: Status.INVALID_ARGUMENT,
    415: Status.INVALID_ARGUMENT,
    429: Status.RESOURCE_EXHAUSTED,
    431: Status.INVALID_ARGUMENT,
    500: Status.INTERNAL,
    502: Status.UNAVAILABLE,
    503: Status.UNAVAILABLE,
    504: Status.DEADLINE_EXCEEDED,
}


def status_code(status: str | None) -> Status:
    """The `Status` of a transport's status: ``"StatusCode.UNAVAILABLE"`` (gRPC), ``"503"`` (HTTP), or ours."""
    name = (status or "").removeprefix("StatusCode.")
    if name in Status.__members__:
        return Status[name]
    return HTTP_CODES.get(int(name), Status.UNKNOWN) if name.isdigit() else Status.UNKNOWN


# gRPC reports "nobody listens" and "server overloaded" with the same code (UNAVAILABLE); only the message
# tells them apart. These are the phrases grpc-core uses for connection set-up failures.
_GRPC_CONNECT_FAILURE = re.compile(
    r"failed to connect|connection refused|errors resolving|dns resolution failed|connection reset"
    r"|socket closed|Connection timed out",
    re.IGNORECASE,
)


class ClientError(Exception):
    """A request to Triton failed.

    `code` says why, the same for gRPC and HTTP (`Status`); `status` says it in the transport's own words: a
    gRPC code such as ``"StatusCode.INVALID_ARGUMENT"``, an HTTP status such as ``"400"``, or one of
    `UNREACHABLE`, `DEADLINE_EXCEEDED`, `BAD_RESPONSE` for failures that never produced a server answer.
    `message` is the server's explanation (or ours) without the status prefix.
    """

    def __init__(self, message: str, status: str | None = None, url: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = status_code(status)
        self.url = url

    def __str__(self) -> str:
        return f"[{self.status}] {self.message}" if self.status else self.message


class ServerUnreachable(ClientError):
    """No Triton server answered at `url` (refused, unresolvable, reset before a response)."""


def to_client_error(error: BaseException, url: str, timeout_s: float) -> ClientError | None:
    """Translate a transport exception into a `ClientError`; None means "not ours, let it propagate"."""
    if isinstance(error, ClientError):
        return error
    if isinstance(error, InferenceServerException):
        return _from_triton_exception(error, url)
    if isinstance(error, TimeoutError):  # also asyncio.TimeoutError and socket.timeout
        return ClientError(f"no response from {url} within {timeout_s:g} s", DEADLINE_EXCEEDED, url)
    if _is_connection_failure(error):
        return ServerUnreachable(f"cannot connect to {url}: {error}", UNREACHABLE, url)
    return None


def _from_triton_exception(error: InferenceServerException, url: str) -> ClientError:
    status = error.status()
    message = error.message() or str(error)
    if status == "StatusCode.UNAVAILABLE" and _GRPC_CONNECT_FAILURE.search(message):
        return ServerUnreachable(message, status, url)
    return ClientError(message, status, url)


def _is_connection_failure(error: BaseException) -> bool:
    """OSError covers geventhttpclient and aiohttp's connect errors; both also have non-OSError ones for a server
    that closed the connection before answering (a replica stopping, say): geventhttpclient's HTTPConnectionClosed,
    aiohttp's ServerDisconnectedError. Each library is only checked if already imported, i.e. in use.
    """
    aiohttp = sys.modules.get("aiohttp")
    gevent_response = sys.modules.get("geventhttpclient.response")
    return (
        isinstance(error, OSError)
        or (aiohttp is not None and isinstance(error, aiohttp.ClientConnectionError))
        or (gevent_response is not None and isinstance(error, gevent_response.HTTPConnectionClosed))
    )


@contextmanager
def translated_errors(url: str, timeout_s: float) -> Iterator[None]:
    """Re-raise transport exceptions raised inside the block as `ClientError` (the original stays as cause).

    Works around ``await`` too, which is why the sync and async clients can share it.
    """
    try:
        yield
    except Exception as error:
        translated = to_client_error(error, url, timeout_s)
        if translated is None or translated is error:
            raise
        raise translated from error


# A decoupled model's error response reaches a gRPC stream as its message alone (Triton 2.51; tritonclient builds
# InferenceServerException(msg=...) without a status), so its kind is read from the message: Triton's queue
# refusals and the engine's full queue are UNAVAILABLE (retried), the front models' own failures INTERNAL, and
# every other error a front model answers with is its refusal of the request.
_STREAM_UNAVAILABLE = re.compile(r"Exceeds maximum queue size|Request timeout expired|queue is full")
_STREAM_INTERNAL = re.compile(r"^(internal error|generation failed)")


def stream_error(error: BaseException, url: str, timeout_s: float) -> ClientError | None:
    """`to_client_error` for what a stream's reader got: an error response without a status takes the one its
    message names (above)."""
    if isinstance(error, InferenceServerException) and error.status() is None:
        message = error.message() or str(error)
        if _STREAM_UNAVAILABLE.search(message):
            return ClientError(message, "StatusCode.UNAVAILABLE", url)
        if _STREAM_INTERNAL.search(message):
            return ClientError(message, "StatusCode.INTERNAL", url)
        return ClientError(message, "StatusCode.INVALID_ARGUMENT", url)
    return to_client_error(error, url, timeout_s)
