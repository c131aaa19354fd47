"""Request texts for the load test: the real test sets when a data directory is given, else a small built-in list.

Both come from each task's definition (``[loadtest]`` in ``tasks/<name>.toml``): ``file`` under ``--data-dir``
(a CSV read by header name, or a TSV read by column index) and ``texts``, the fallback. The default mix weighs
the tasks by their ``weight``.

Streaming twins: a task whose definition says ``stream = true`` has a twin, ``<task>_stream`` (tasks/definition.py),
which the mix may name like any endpoint (``--mix translate_stream:1,translate:1``). A twin sends its task's texts
(paragraphs included) and options; the locustfile calls it over a gRPC stream or HTTP ``generate_stream`` and times
the first piece, the pieces after it and the whole answer. The default mix leaves the twins out (weight 0).

Paragraphs: for a task whose ``[loadtest]`` says ``paragraphs = true`` (its texts are sentences: translate's Tatoeba
sentences, sentiment's short reviews), a share of its requests (``--paragraphs``, default 0.2: one in five) sends
4-8 consecutive texts of its list joined as Chinese is written, with no space between them (a text that does not
end with end punctuation gets a "。"). Such a request is named ``<endpoint> (paragraph)`` so that locust's stats,
and the report, keep its latency apart from single sentences. ``--paragraphs 0`` sends single texts only.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.definition import LoadTexts, Option, registry


def endpoints() -> dict[str, LoadTexts]:
    """Every endpoint the mix may name → its texts: each task, then each streaming twin (its task's texts)."""
    found = {name: task.loadtest for name, task in registry().items()}
    return found | {twin: found[task] for twin, task in stream_endpoints().items()}


def stream_endpoints() -> dict[str, str]:
    """Each streaming twin's name (``<task>_stream``) → its task."""
    return {task.stream.name: name for name, task in registry().items() if task.stream is not None}


def task_of(endpoint: str) -> str:
    """The task an endpoint belongs to: itself, or a streaming twin's task."""
    return stream_endpoints().get(endpoint, endpoint)


def is_stream(endpoint: str) -> bool:
    return endpoint in stream_endpoints()


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
    return {o.input: values[o.keyword] for o in registry()[task_of(endpoint)].options if values.get(o.keyword)}


def keywords_for(endpoint: str, values: dict[str, int | str]) -> dict[str, int | str]:
    """The SDK's keyword -> value for the options of `endpoint` that were set (as :func:`inputs_for`)."""
    return {o.keyword: values[o.keyword] for o in registry()[task_of(endpoint)].options if values.get(o.keyword)}


def default_mix() -> str:
    """The tasks by their ``weight``; the streaming twins are left out (name them in ``--mix`` to load them)."""
    return ",".join(f"{name}:{task.loadtest.weight:g}" for name, task in registry().items())


def _read(spec: LoadTexts, path: Path) -> list[str]:
    with open(path, encoding="utf-8", newline="") as f:
        if isinstance(spec.column, str):
            return [(row.get(spec.column) or "").strip() for row in csv.DictReader(f)]
        rows = [line.rstrip("\n").split("\t") for line in f]
    rows = rows[1:] if spec.header else rows
    return [cols[spec.column].strip() for cols in rows if len(cols) > spec.column]


def load_texts(data_dir: Path | str | None, limit: int = 2000) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(texts per endpoint, where each list came from). Missing files fall back to the built-in list. A streaming
    twin shares its task's list (read once)."""
    texts: dict[str, list[str]] = {}
    sources: dict[str, str] = {}
    for endpoint, spec in endpoints().items():
        task = task_of(endpoint)
        if task in texts:
            texts[endpoint], sources[endpoint] = texts[task], sources[task]
            continue
        path = Path(data_dir) / spec.file if data_dir and spec.file else None
        found = [t for t in _read(spec, path) if t][:limit] if path is not None and path.is_file() else []
        texts[endpoint] = found or list(spec.texts)
        sources[endpoint] = str(path) if found else "built-in list"
    return texts, sources


def parse_mix(mix: str) -> dict[str, float]:
    """``"sentiment:6,translate:3,summarize:1"`` → weights; endpoints left out (the streaming twins too) get
    weight 0."""
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


DEFAULT_PARAGRAPHS = 0.2  # share of a paragraph task's requests that send a paragraph: one in five
PARAGRAPH_SENTENCES = (4, 8)  # sentences a paragraph joins, both ends included
PARAGRAPH_SUFFIX = " (paragraph)"  # appended to the endpoint to name a paragraph request in locust's stats
END_PUNCTUATION = "。！？!?…"
CLOSING = "”’」』）)\"'"


def paragraph_endpoints() -> list[str]:
    """The tasks whose load-test texts are sentences (``paragraphs = true`` in their ``[loadtest]``)."""
    return [name for name, spec in endpoints().items() if spec.paragraphs]


def parse_paragraphs(value: str | float) -> float:
    """The paragraph share, a number in [0, 1] (also an argparse type)."""
    try:
        share = float(value)
    except ValueError:
        raise ValueError(f"paragraphs must be a number between 0 and 1, got {value!r}") from None
    if not 0 <= share <= 1:
        raise ValueError(f"paragraphs must be between 0 and 1, got {value!r}")
    return share


def join_sentences(sentences: list[str]) -> str:
    """Chinese sentences joined as written: no space between them; one without end punctuation gets a "。"."""
    return "".join(s if s.rstrip(CLOSING)[-1:] in END_PUNCTUATION else s + "。" for s in sentences)


def paragraph_name(endpoint: str) -> str:
    return endpoint + PARAGRAPH_SUFFIX


def split_name(name: str) -> tuple[str, bool]:
    """A request name → (endpoint, whether it is a paragraph request)."""
    if name.endswith(PARAGRAPH_SUFFIX):
        return name[: -len(PARAGRAPH_SUFFIX)], True
    return name, False


@dataclass(frozen=True)
class Request:
    endpoint: str
    name: str  # the name locust's stats keep it under: the endpoint, or "<endpoint> (paragraph)"
    text: str
    sentences: int  # texts of the list it joins: 1 for a single text


class Picker:
    """Draws requests: an endpoint by the mix weights, then a single text of its list or, for a paragraph task with
    probability `paragraphs`, 4-8 consecutive texts of its list joined (after its last text comes its first). The
    same `seed` draws the same requests."""

    def __init__(
        self, texts: dict[str, list[str]], weights: dict[str, float], paragraphs: float, seed: int | None = None
    ):
        self.texts = texts
        self.endpoints = [e for e, w in weights.items() if w > 0]
        self.weights = [w for w in weights.values() if w > 0]
        self.paragraphs = parse_paragraphs(paragraphs)
        self.joinable = set(paragraph_endpoints())
        self.rng = random.Random(seed)

    def pick(self) -> Request:
        endpoint = self.rng.choices(self.endpoints, self.weights)[0]
        texts = self.texts[endpoint]
        if endpoint in self.joinable and self.paragraphs and self.rng.random() < self.paragraphs:
            n = self.rng.randint(*PARAGRAPH_SENTENCES)
            start = self.rng.randrange(len(texts))  # the list read as a ring: a short built-in list wraps around
            sentences = [texts[(start + k) % len(texts)] for k in range(n)]
            return Request(endpoint, paragraph_name(endpoint), join_sentences(sentences), n)
        return Request(endpoint, endpoint, self.rng.choice(texts), 1)
