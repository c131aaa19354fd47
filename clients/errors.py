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

from tritonclient.utils import InferenceServerException

UNREACHABLE = "UNREACHABLE"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
BAD_RESPONSE = "BAD_RESPONSE"

# gRPC reports "nobody listens" and "server overloaded" with the same code (UNAVAILABLE); only the message
# tells them apart. These are the phrases grpc-core uses for connection set-up failures.
_GRPC_CONNECT_FAILURE = re.compile(
    r"failed to connect|connection refused|errors resolving|dns resolution failed|connection reset"
    r"|socket closed|Connection timed out",
    re.IGNORECASE,
)


class ClientError(Exception):
    """A request to Triton failed.

    `status` says why in the transport's own words: a gRPC code such as ``"StatusCode.INVALID_ARGUMENT"``,
    an HTTP status such as ``"400"``, or one of `UNREACHABLE`, `DEADLINE_EXCEEDED`, `BAD_RESPONSE` for
    failures that never produced a server answer. `message` is the server's explanation (or ours) without
    the status prefix.
    """

    def __init__(self, message: str, status: str | None = None, url: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
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
    """OSError covers geventhttpclient and aiohttp's connect errors; aiohttp also has non-OSError ones
    (server disconnected). aiohttp is only checked if already imported, i.e. when the HTTP asyncio client
    is in use.
    """
    aiohttp = sys.modules.get("aiohttp")
    return isinstance(error, OSError) or (aiohttp is not None and isinstance(error, aiohttp.ClientConnectionError))


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
