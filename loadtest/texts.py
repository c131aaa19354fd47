"""Request texts for the load test: the real test sets when a data directory is given, else a small built-in list.

Both come from each task's definition (``[loadtest]`` in ``tasks/<name>.toml``): ``file`` under ``--data-dir``
(a CSV read by header name, or a TSV read by column index) and ``texts``, the fallback. The default mix weighs
the tasks by their ``weight``.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from tasks.definition import LoadTexts, Option, registry


def endpoints() -> dict[str, LoadTexts]:
    return {name: task.loadtest for name, task in registry().items()}


def options() -> dict[str, Option]:
    """Every task option by keyword, once: the load test sends one value to every task that takes it."""
    found: dict[str, Option] = {}
    for task in registry().values():
        for option in task.options:
            found.setdefault(option.keyword, option)
    return found


def option_flag(keyword: str) -> str:
    return "--" + keyword.replace("_", "-")


def add_option_flags(parser: Any) -> None:
    """A flag per option for the runner and the locustfile (an argparse parser or group): an int, or one of a
    string option's choices; unset (0 or "") leaves the server's default."""
    for keyword, option in options().items():
        if option.choices:
            parser.add_argument(
                option_flag(keyword), choices=option.choices, default="", help=f"{option.input} (unset: server default)"
            )
        else:
            parser.add_argument(option_flag(keyword), type=int, default=0, help=f"{option.input} (0: server default)")


def inputs_for(endpoint: str, values: dict[str, int | str]) -> dict[str, int | str]:
    """Triton input name -> value for the options of `endpoint` that were set (0 or "" means the server default).
    A str value goes as BYTES, an int as INT32 (the flags give each option's values its type)."""
    return {o.input: values[o.keyword] for o in registry()[endpoint].options if values.get(o.keyword)}


def default_mix() -> str:
    return ",".join(f"{name}:{spec.weight:g}" for name, spec in endpoints().items())


def _read(spec: LoadTexts, path: Path) -> list[str]:
    with open(path, encoding="utf-8", newline="") as f:
        if isinstance(spec.column, str):
            return [(row.get(spec.column) or "").strip() for row in csv.DictReader(f)]
        rows = [line.rstrip("\n").split("\t") for line in f]
    rows = rows[1:] if spec.header else rows
    return [cols[spec.column].strip() for cols in rows if len(cols) > spec.column]


def load_texts(data_dir: Path | str | None, limit: int = 2000) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(texts per endpoint, where each list came from). Missing files fall back to the built-in list."""
    texts: dict[str, list[str]] = {}
    sources: dict[str, str] = {}
    for endpoint, spec in endpoints().items():
        path = Path(data_dir) / spec.file if data_dir and spec.file else None
        found = [t for t in _read(spec, path) if t][:limit] if path is not None and path.is_file() else []
        texts[endpoint] = found or list(spec.texts)
        sources[endpoint] = str(path) if found else "built-in list"
    return texts, sources


def parse_mix(mix: str) -> dict[str, float]:
    """``"sentiment:6,translate:3,summarize:1"`` → weights; endpoints left out get weight 0."""
    names = list(endpoints())
    weights = dict.fromkeys(names, 0.0)
    for part in filter(None, (p.strip() for p in mix.split(","))):
        name, _, weight = part.partition(":")
        if name not in weights:
            raise ValueError(f"unknown endpoint {name!r} in mix {mix!r}; choose from {', '.join(names)}")
        try:
            weights[name] = float(weight or 1)
        except ValueError:
            raise ValueError(f"weight of {name} in mix {mix!r} must be a number") from None
        if weights[name] < 0:
            raise ValueError(f"weight of {name} in mix {mix!r} must be >= 0")
    if not any(weights.values()):
        raise ValueError(f"mix {mix!r} gives every endpoint weight 0")
    return weights
