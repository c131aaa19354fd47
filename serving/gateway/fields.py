"""Reading what a client sent: JSON or form bodies (DeepL and LibreTranslate accept both), and its API key."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from .errors import GatewayError

MAX_TEXTS = 50  # texts per request: DeepL's limit, which LibreTranslate's and the /v1 routes keep too

Fields = Mapping[str, Any]  # a field's value: a str, or a list of str for a repeated form field / JSON array


async def read_fields(request: Request) -> Fields:
    """The request's parameters: its JSON object, or its form fields (a repeated field becomes a list), over
    the query string's."""
    fields: dict[str, Any] = {}
    for name in request.query_params:
        values = request.query_params.getlist(name)
        fields[name] = values if len(values) > 1 else values[0]
    if not await request.body():
        return fields
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        try:
            body = json.loads(await request.body() or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise GatewayError(400, f"the body is not valid JSON: {error}") from None
        if not isinstance(body, dict):
            raise GatewayError(400, "the JSON body must be an object")
        fields.update(body)
    elif content_type in ("application/x-www-form-urlencoded", ""):
        # Decoded here as UTF-8, percent-escaped or not (curl -d sends the raw bytes); Starlette's form parser
        # would read unescaped bytes as Latin-1.
        try:
            pairs = urllib.parse.parse_qsl((await request.body()).decode("utf-8"), keep_blank_values=True)
        except UnicodeDecodeError:
            raise GatewayError(400, "the form body is not valid UTF-8") from None
        form_fields: dict[str, list[str]] = {}
        for name, value in pairs:
            form_fields.setdefault(name, []).append(value)
        fields.update({name: v if len(v) > 1 else v[0] for name, v in form_fields.items()})
    elif content_type == "multipart/form-data":
        form = await request.form()
        for name in form:
            values = [v for v in form.getlist(name) if isinstance(v, str)]
            fields[name] = values if len(values) > 1 else (values[0] if values else "")
    else:
        raise GatewayError(415, f"unsupported Content-Type {content_type!r}: send JSON or a form")
    return fields


def presented_key(request: Request, fields: Fields) -> str | None:
    """The key in ``Authorization: DeepL-Auth-Key <key>`` or ``Bearer <key>``, else an ``api_key`` (LibreTranslate)
    or ``auth_key`` (DeepL's older form) field."""
    authorization = request.headers.get("authorization", "")
    scheme, _, credential = authorization.partition(" ")
    if scheme.lower() in ("deepl-auth-key", "bearer") and credential.strip():
        return credential.strip()
    for name in ("api_key", "auth_key"):
        value = fields.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def texts_field(fields: Fields, name: str, limit: int) -> tuple[list[str], bool]:
    """(the texts of field `name`, whether it was a list): a string or a list of 1..limit strings."""
    value = fields.get(name)
    if value is None or value == "" or value == []:
        raise GatewayError(400, f"parameter {name!r} is missing: give a text or a list of texts")
    as_list = isinstance(value, list)
    texts = value if as_list else [value]
    if len(texts) > limit:
        raise GatewayError(400, f"parameter {name!r} has {len(texts)} texts; at most {limit} per request")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise GatewayError(400, f"{name}[{i}] must be a string, got {type(text).__name__}")
    return texts, as_list


def count_field(fields: Fields, name: str) -> int:
    value = fields.get(name) or 0
    try:
        return int(value)
    except (TypeError, ValueError):
        raise GatewayError(400, f"parameter {name!r} must be a whole number, got {value!r}") from None


def flag_field(fields: Fields, name: str, default: bool = False) -> bool:
    """A boolean parameter as DeepL takes it: true/false, 1/0 (JSON booleans or form strings)."""
    value = fields.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true"):
        return True
    if text in ("0", "false"):
        return False
    raise GatewayError(400, f"parameter {name!r} must be 0, 1, true or false, got {value!r}")
