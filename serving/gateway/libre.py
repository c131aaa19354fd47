"""LibreTranslate's API: ``POST /translate``, ``GET /languages``, ``POST /detect`` (JSON or form bodies, the
key in ``api_key``). ``libretranslatepy.LibreTranslateAPI("http://127.0.0.1:5000")`` works unmodified."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from . import html_text
from .errors import GatewayError
from .fields import MAX_TEXTS, count_field, read_fields, texts_field
from .gateway_state import state_of
from .service import detect_language

LANGUAGES = [
    {"code": "en", "name": "English", "targets": []},
    {"code": "zh", "name": "Chinese", "targets": ["en"]},
]
_SOURCES = {"zh", "zh-hans", "zh-cn", "auto"}


async def translate(request: Request) -> JSONResponse:
    """Translate a text or a list of texts (LibreTranslate)."""
    fields = await read_fields(request)
    state = state_of(request)
    account = state.authenticate(request, fields)
    texts, as_list = texts_field(fields, "q", MAX_TEXTS)
    source = str(fields.get("source", "")).lower()
    target = str(fields.get("target", "")).lower()
    if source not in _SOURCES:
        raise GatewayError(400, f"{source or 'source'!r} is not supported as source: zh (or auto)")
    if target != "en":
        raise GatewayError(400, f"{target or 'target'!r} is not supported as target: en")
    text_format = str(fields.get("format", "text")).lower()
    if text_format not in ("text", "html"):
        raise GatewayError(400, f"format {text_format!r} is not supported: text or html")
    html = text_format == "html"
    characters = sum(html_text.characters(t) if html else len(t) for t in texts)
    async with state.metered(account, characters):
        translations = await state.triton.translate(texts, {}, html=html)
    body: dict[str, Any] = {"translatedText": translations if as_list else translations[0]}
    if source == "auto":
        detected = [detect_language(t)[0] for t in texts]
        body["detectedLanguage"] = detected if as_list else detected[0]
    if count_field(fields, "alternatives") > 0:
        body["alternatives"] = [[] for _ in texts] if as_list else []  # the models give one answer per text
    return JSONResponse(body)


async def languages(request: Request) -> JSONResponse:
    """Languages and their targets (LibreTranslate)."""
    state_of(request).authenticate(request, await read_fields(request))
    return JSONResponse(LANGUAGES)


async def detect(request: Request) -> JSONResponse:
    """Guess a text's language (LibreTranslate)."""
    fields = await read_fields(request)
    state_of(request).authenticate(request, fields)
    [text], _ = texts_field(fields, "q", 1)
    return JSONResponse(detect_language(text))


routes = [
    Route("/translate", translate, methods=["POST"], name="libre_translate"),
    Route("/languages", languages, methods=["GET"], name="libre_languages"),
    Route("/detect", detect, methods=["POST"], name="libre_detect"),
]
