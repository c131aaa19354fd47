"""One error type for every route, rendered in the dialect of the API that was called."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.responses import JSONResponse

from clients import ClientError, Status

# DeepL's status for "the character quota of this key is spent" (its clients raise QuotaExceededException).
QUOTA_EXCEEDED = 456
OPENAI_PATHS = ("/v1/models", "/v1/chat/completions", "/v1/completions")  # serving/gateway/openai_api.py
OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
}
CONTEXT_EXCEEDED = "the model's context is"  # how the chat twin's refusal of a too-long prompt reads


@dataclass
class GatewayError(Exception):
    """A request the gateway refuses or could not serve; `status` is the HTTP status to answer with."""

    status: int
    message: str
    retry_after_s: int | None = None
    param: str | None = None  # the request's field at fault (OpenAI's errors name it)
    code: str | None = None  # OpenAI's error code, where it has one ("model_not_found")

    def __str__(self) -> str:
        return self.message


def error_response(path: str, error: GatewayError) -> JSONResponse:
    """DeepL's clients read ``message``, LibreTranslate's ``error``, FastAPI-style clients ``detail``, OpenAI's
    ``error.message`` (serving/gateway/openai_api.py)."""
    if path in OPENAI_PATHS:
        return _openai_response(error)
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


def openai_status(status: int) -> int:
    return 429 if status == QUOTA_EXCEEDED else status  # OpenAI's "insufficient_quota" is a 429


def openai_body(error: GatewayError) -> dict[str, object]:
    """``{"error": {"message", "type", "param", "code"}}``, as OpenAI's clients read it."""
    status = openai_status(error.status)
    kind = OPENAI_ERROR_TYPES.get(status, "server_error")
    code = error.code
    if code is None and error.status == QUOTA_EXCEEDED:
        code = "insufficient_quota"
    elif code is None and error.status == 400 and CONTEXT_EXCEEDED in error.message:
        code = "context_length_exceeded"
    return {"error": {"message": error.message, "type": kind, "param": error.param, "code": code}}


def _openai_response(error: GatewayError) -> JSONResponse:
    headers = {} if error.retry_after_s is None else {"Retry-After": str(error.retry_after_s)}
    return JSONResponse(openai_body(error), status_code=openai_status(error.status), headers=headers)
