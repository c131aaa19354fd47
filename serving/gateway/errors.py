"""One error type for every route, rendered in the dialect of the API that was called."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.responses import JSONResponse

from clients import ClientError, Status

# DeepL's status for "the character quota of this key is spent" (its clients raise QuotaExceededException).
QUOTA_EXCEEDED = 456


@dataclass
class GatewayError(Exception):
    """A request the gateway refuses or could not serve; `status` is the HTTP status to answer with."""

    status: int
    message: str
    retry_after_s: int | None = None

    def __str__(self) -> str:
        return self.message


def error_response(path: str, error: GatewayError) -> JSONResponse:
    """DeepL's clients read ``message``, LibreTranslate's ``error``, FastAPI-style clients ``detail``."""
    if path.startswith("/v2/"):
        body = {"message": error.message}
    elif path.startswith("/v1/"):
        body = {"detail": error.message}
    else:
        body = {"error": error.message}
    headers = {} if error.retry_after_s is None else {"Retry-After": str(error.retry_after_s)}
    return JSONResponse(body, status_code=error.status, headers=headers)


def from_client_error(error: ClientError) -> GatewayError:
    """Triton's answer as the gateway's: bad input stays 400 with Triton's message (it names the problem);
    overload and an unreachable server are 503, which DeepL's and our clients retry; a timeout is 504."""
    if error.code is Status.INVALID_ARGUMENT:
        return GatewayError(400, error.message)
    if error.code is Status.DEADLINE_EXCEEDED:
        return GatewayError(504, f"the model did not answer in time: {error.message}")
    if error.code in (Status.UNAVAILABLE, Status.RESOURCE_EXHAUSTED, Status.UNREACHABLE):
        return GatewayError(503, f"the model server is busy or unreachable, retry later: {error.message}", 1)
    return GatewayError(502, f"the model server failed: {error.message}")
