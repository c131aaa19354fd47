"""The gateway's OpenAPI document, written from its routes: the /v1 bodies' JSON schemas come from the same
pydantic models that validate them (so from the task definitions); the DeepL and LibreTranslate routes point to
their own APIs' documentation, which they follow."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from starlette.routing import Route

REFERENCES = {
    "/v2/": "DeepL API v2: https://developers.deepl.com/api-reference (the part docs/gateway.md lists)",
    "/translate": "LibreTranslate: https://docs.libretranslate.com (the part docs/gateway.md lists)",
    "/languages": "LibreTranslate: https://docs.libretranslate.com",
    "/detect": "LibreTranslate: https://docs.libretranslate.com",
}


def document(routes: list[tuple[Route, type[BaseModel] | None, str]]) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for route, model, summary in routes:
        operation: dict[str, Any] = {"summary": summary, "operationId": route.name, "responses": {"200": {
            "description": "the answer"}, "400": {"description": "bad input, named"}}}  # fmt: skip
        reference = next((text for prefix, text in REFERENCES.items() if route.path.startswith(prefix)), None)
        if reference:
            operation["description"] = reference
        if model is not None:
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
            }
        for method in sorted(route.methods or ()):
            if method != "HEAD":
                paths.setdefault(route.path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "ropeserve gateway", "version": "1",
                 "description": "DeepL API v2, LibreTranslate and plain JSON for the ropeserve models on Triton"},
        "paths": paths,
        "components": {"schemas": schemas},
    }  # fmt: skip
