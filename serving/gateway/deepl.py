"""DeepL API v2, the part a translator app uses: ``POST /v2/translate``, ``GET|POST /v2/languages``,
``GET|POST /v2/usage``, authenticated with ``Authorization: DeepL-Auth-Key <key>``.

DeepL's official clients work unmodified with ``server_url`` pointing here (``deepl.Translator(key,
server_url="http://127.0.0.1:5000")``). What DeepL has and we do not is refused with 400 naming the parameter,
never ignored: glossaries, ``formality`` more/less, ``context``, XML tag handling, other languages.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from . import html_text
from .errors import GatewayError
from .fields import MAX_TEXTS, Fields, flag_field, read_fields, texts_field
from .gateway_state import state_of
from .keys import UNLIMITED_CHARACTERS

SOURCE_LANGUAGES = [{"language": "ZH", "name": "Chinese"}]
TARGET_LANGUAGES = [
    {"language": "EN-GB", "name": "English (British)", "supports_formality": False},
    {"language": "EN-US", "name": "English (American)", "supports_formality": False},
]
_TARGETS = {"EN", "EN-GB", "EN-US"}
_SOURCES = {"ZH", "ZH-HANS"}
_SPLIT = {"0": "0", "1": "1", "nonewlines": "nonewlines"}
_REFUSED = {
    "glossary_id": "glossaries are not supported",
    "context": "context is not supported: the models read one sentence at a time",
    "custom_instructions": "custom_instructions are not supported",
    "style_id": "style rules are not supported",
}


async def translate(request: Request) -> JSONResponse:
    """Translate texts (DeepL API v2)."""
    fields = await read_fields(request)
    state = state_of(request)
    account = state.authenticate(request, fields)
    texts, _ = texts_field(fields, "text", MAX_TEXTS)
    html = _check_options(fields)
    split = str(fields.get("split_sentences", "nonewlines" if html else "1"))
    if split not in _SPLIT:
        raise GatewayError(400, f"Value for 'split_sentences' not supported: {split!r} (0, 1 or nonewlines)")
    characters = [html_text.characters(t) if html else len(t) for t in texts]
    async with state.metered(account, sum(characters)):
        translations = await state.triton.translate(texts, {"split_sentences": _SPLIT[split]}, html=html)
    show_billed = flag_field(fields, "show_billed_characters")
    results: list[dict[str, Any]] = []
    for text, billed in zip(translations, characters):
        result: dict[str, Any] = {"detected_source_language": "ZH", "text": text}
        if show_billed:
            result["billed_characters"] = billed
        results.append(result)
    return JSONResponse({"translations": results})


def _check_options(fields: Fields) -> bool:
    """Refuse what we cannot honour; True when the texts are HTML."""
    target = str(fields.get("target_lang", "")).upper()
    if not target:
        raise GatewayError(400, "Parameter 'target_lang' not specified.")
    if target not in _TARGETS:
        raise GatewayError(400, f"Value for 'target_lang' not supported: {target} (this server translates ZH to EN)")
    source = str(fields.get("source_lang", "") or "").upper()
    if source and source not in _SOURCES:
        raise GatewayError(400, f"Value for 'source_lang' not supported: {source} (this server translates from ZH)")
    for name, why in _REFUSED.items():
        if fields.get(name):
            raise GatewayError(400, f"'{name}': {why}")
    formality = str(fields.get("formality", "default")).lower()
    if formality not in ("default", "prefer_more", "prefer_less"):
        raise GatewayError(
            400, f"'formality' {formality!r} is not supported for EN (default, prefer_more, prefer_less)"
        )
    flag_field(fields, "preserve_formatting")  # validated; line breaks and spacing are always kept
    tag_handling = str(fields.get("tag_handling", "") or "").lower()
    if tag_handling not in ("", "html"):
        raise GatewayError(400, f"'tag_handling' {tag_handling!r} is not supported (html, or none)")
    return tag_handling == "html"


async def languages(request: Request) -> JSONResponse:
    """Source or target languages (DeepL API v2)."""
    fields = await read_fields(request)
    state_of(request).authenticate(request, fields)
    kind = str(fields.get("type", "source")).lower()
    if kind not in ("source", "target"):
        raise GatewayError(400, f"Value for 'type' not supported: {kind!r} (source or target)")
    return JSONResponse(SOURCE_LANGUAGES if kind == "source" else TARGET_LANGUAGES)


async def usage(request: Request) -> JSONResponse:
    """Characters used by this key, and its limit (DeepL API v2)."""
    fields = await read_fields(request)
    account = state_of(request).authenticate(request, fields)
    limit = UNLIMITED_CHARACTERS if account.character_limit is None else account.character_limit
    return JSONResponse({"character_count": account.characters, "character_limit": limit})


routes = [
    Route("/v2/translate", translate, methods=["POST"], name="deepl_translate"),
    Route("/v2/languages", languages, methods=["GET", "POST"], name="deepl_languages"),
    Route("/v2/usage", usage, methods=["GET", "POST"], name="deepl_usage"),
]
