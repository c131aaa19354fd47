"""The contract part of a task definition, as a definition file of its own: what the SDK's wheel carries
(clients/hatch_build.py). It keeps what a client reads (the summary and example, the options, each endpoint's
outputs and description, which twins exist) and leaves out what only the server reads: front models, instances,
queues, ONNX models, engine settings, checkpoints and load-test texts. `contract = true` tells the reader
(tasks/definition.py) not to ask for them.

Standard library only, like tasks/definition.py: it runs inside the wheel's build environment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10, as in tasks/definition.py
    import tomli as tomllib  # type: ignore[no-redef]

TOP_KEYS = ("summary", "example", "result")
ENDPOINT_KEYS = ("outputs", "about")
ENDPOINTS = ("endpoint", "stream", "explain", "chat")


def contract(definition: Mapping[str, Any]) -> dict[str, Any]:
    """The contract part of a parsed definition (a TOML document as a dict)."""
    kept: dict[str, Any] = {"contract": True}
    kept.update({key: definition[key] for key in TOP_KEYS if key in definition})
    if "options" in definition:
        kept["options"] = definition["options"]
    for table in ENDPOINTS:
        if table in definition:
            kept[table] = {key: definition[table][key] for key in ENDPOINT_KEYS if key in definition[table]}
    return kept


def dumps(document: Mapping[str, Any]) -> str:
    """TOML for the values a definition holds: strings, numbers, booleans, lists and tables of them. Nested tables
    get headers (``[options.num_beams]``); tables inside lists are written inline."""
    lines: list[str] = []
    _table(document, (), lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def write(source: Path, target: Path) -> None:
    """The contract of the definition in `source`, written to `target`."""
    document = tomllib.loads(Path(source).read_text(encoding="utf-8"))
    Path(target).write_text(dumps(contract(document)), encoding="utf-8")


def _table(table: Mapping[str, Any], path: tuple[str, ...], lines: list[str]) -> None:
    nested = {key: value for key, value in table.items() if isinstance(value, Mapping)}
    if path:
        lines += ["", f"[{'.'.join(_key(part) for part in path)}]"]
    lines += [f"{_key(key)} = {_value(value)}" for key, value in table.items() if key not in nested]
    for key, value in nested.items():
        _table(value, (*path, key), lines)


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() and key.isascii() else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as TOML")
