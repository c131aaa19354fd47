"""A task's contract, read from its definition file (``tasks/<name>.toml``).

Everything that makes a task an endpoint is declared there once: its options (optional inputs next to ``TEXT``, one
value per request: an INT32 with a default and a range, or a BYTES string with a default and its choices), its
outputs, the ONNX models its front model calls, the assets the front model reads, batching, queue and instance
settings, an optional explain twin, and where the load test finds texts. The Triton configs are generated from it
(:mod:`tasks.triton_config`), the front models read it at start-up, and the SDK, the CLI and the load test derive
their methods, commands and entries from it.

This module needs only the standard library: the Python backend stubs, the client SDK and locust import it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (the SDK's oldest): the same parser as a package
    import tomli as tomllib  # type: ignore[no-redef]

BUILTIN_DIR = Path(__file__).resolve().parent
PATH_VARIABLE = "ROPESERVE_TASKS_PATH"  # more definition folders, os.pathsep-separated (a task of your own)
TEXT_INPUT = "TEXT"  # every endpoint takes its texts as BYTES [N, 1] under this name
TENSOR_TYPES = ("string", "int32", "int64", "fp32")


class DefinitionError(ValueError):
    """A definition file that cannot describe a task; the message names the file and the field."""


@dataclass(frozen=True)
class Tensor:
    """An input or output: its name, element type and dims without the batch dimension."""

    name: str
    type: str
    dims: tuple[int, ...] = (1,)
    note: str = ""  # a comment for the generated config


@dataclass(frozen=True)
class Option:
    """An optional input, one value per request: the SDK keyword, the CLI flags and the Triton input.

    An int option (INT32) accepts ``low..high``; a string option (BYTES, UTF-8) accepts one of ``choices``. Which
    kind it is follows from ``choices``, so the two can never disagree; a string option's ``low``/``high`` are 0.
    """

    keyword: str
    input: str
    default: int | str
    help: str
    flags: tuple[str, ...]
    low: int = 0
    high: int = 0
    choices: tuple[str, ...] = ()  # empty for an int option

    @property
    def type(self) -> str:
        """The element type of its Triton input, as in :data:`TENSOR_TYPES`: "string" or "int32"."""
        return "string" if self.choices else "int32"

    @property
    def allowed(self) -> str:
        """The values it accepts, for help texts: ``1..8`` or ``one of abstractive, extractive``."""
        return f"one of {', '.join(self.choices)}" if self.choices else f"{self.low}..{self.high}"


@dataclass(frozen=True)
class OnnxModel:
    """A model the front model calls by BLS. ``role`` is how the front model names it (``generator``)."""

    role: str
    name: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    max_batch_size: int = 0
    dynamic_batching: bool = False
    cpu_instances: int = 1
    gpu_instances: int = 1
    threads: int = 2  # ONNX Runtime intra-op threads of the CPU variant
    export: str = ""  # "module:function" writing model.onnx from the task's checkpoint ...
    file: str = ""  # ... or an ONNX file beside the definition
    about: str = ""


@dataclass(frozen=True)
class Endpoint:
    """A public front model (Python backend): the task's own, or its explain twin."""

    name: str
    front: str  # "module:Class"
    outputs: tuple[Tensor, ...]
    max_batch_size: int
    instances: int
    queue_size: int
    queue_timeout_s: float
    models: Mapping[str, OnnxModel]  # role -> model
    about: str = ""
    decoupled: bool = False  # answers with a stream of responses (Triton's decoupled transaction policy)
    graphs: str = ""  # "module:function" writing ONNX graphs the front model runs itself into its version folder
    threads: int = 0  # ONNX Runtime intra-op threads of those graphs (0: not set)
    precision: str = "fp32"  # of those graphs: "fp32", or "int8" (dynamically quantized weights)
    # Whether it takes the task's options beside TEXT; a chat twin's TEXT is a whole request (JSON) instead.
    reads_options: bool = True


@dataclass(frozen=True)
class LoadTexts:
    """Where the load test reads request texts, relative to the data folder, and its fallback texts."""

    weight: float
    texts: tuple[str, ...]
    file: str = ""
    column: str | int = 0  # a CSV header name, or a TSV column index
    header: bool = False
    paragraphs: bool = False  # its texts are sentences: the load test also sends 4-8 of them joined, as a paragraph


@dataclass(frozen=True)
class EngineSettings:
    """The generation engine's knobs (serving/engine/, serving/frontends/engine_front.py), from the task's
    ``[engine]`` table; each default is what the benchmarks and docs/architecture.md measured with."""

    max_rows: int = 256  # rows (texts x beams) of the running batch
    # Rows running and waiting past which a request is refused at once with UNAVAILABLE (bounded latency); a
    # request alone may hold at most this many, so that it can be admitted when the engine is idle.
    max_queued_rows: int = 1024
    # A text read as a document is refused with INVALID_ARGUMENT over either: 128 sentences at the widest beam (8)
    # is the queue bound; 10,000 characters is an article of ~300 sentences of 30 characters.
    max_document_chars: int = 10_000
    max_document_sentences: int = 128
    # A request of more sentences is bulk work: while interactive requests come (one arrived in the last
    # interactive_hold_s), bulk rows hold at most bulk_rows_beside_interactive of the running batch.
    interactive_sentences: int = 4
    bulk_rows_beside_interactive: int = 8
    interactive_hold_s: float = 0.5
    # A decoder-only model's prompts (serving/engine/prefill.py): each engine step reads at most this many prompt
    # tokens beside the running rows' decode step, so a long prompt is read over several steps and the running
    # streams keep their pace; the keys of shared prompt prefixes (a task's instruction, a system message) are
    # kept for reuse up to prefix_cache_mib MiB (0: none kept).
    prefill_chunk_tokens: int = 128
    prefix_cache_mib: int = 256


@dataclass(frozen=True)
class Prompt:
    """How a chat model (a decoder-only import) is asked for the task: the user's message is `instruction` with the
    text at ``{text}``, after a system message when `system` is set; the checkpoint's chat template renders it
    (serving/text/chat.py)."""

    instruction: str
    system: str = ""


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: the registry holds one object per definition
class Task:
    name: str
    summary: str  # one line, for --help
    example: str
    folder: Path  # where the definition lives (a task module and its files may sit beside it)
    options: tuple[Option, ...]
    endpoint: Endpoint
    explain: Endpoint | None
    stream: Endpoint | None  # the endpoint's streaming twin, `<task>_stream`
    loadtest: LoadTexts
    assets: tuple[str, ...]
    checkpoint: str = ""  # checkpoints/<checkpoint> holds the assets and the weights exported to ONNX
    result: str = ""  # the SDK's class name for answers with several outputs
    engine: EngineSettings = EngineSettings()  # for the endpoints served by the generation engine
    prompt: Prompt | None = None  # for a chat model's task
    # A chat model's twin `<task>_chat`, decoupled: TEXT is a chat request (serving/text/chat_request.py), the
    # conversation or prompt the client wrote, answered as a stream (what the gateway's OpenAI API calls).
    chat: Endpoint | None = None
    source: Path = field(default=Path(), compare=False)

    def endpoints(self) -> Iterator[Endpoint]:
        yield self.endpoint
        for twin in (self.stream, self.explain, self.chat):
            if twin is not None:
                yield twin

    def option(self, keyword: str) -> Option:
        for option in self.options:
            if option.keyword == keyword:
                return option
        raise KeyError(f"task {self.name} has no option {keyword!r}")

    def models(self) -> Iterator[OnnxModel]:
        """Every ONNX model of the task, each once."""
        seen: set[str] = set()
        for endpoint in self.endpoints():
            for model in endpoint.models.values():
                if model.name not in seen:
                    seen.add(model.name)
                    yield model


def load(path: Path) -> Task:
    """The task defined in ``path``; :class:`DefinitionError` names what is wrong."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise DefinitionError(f"{path}: {err}") from None
    reader = _Reader(raw, str(path))
    return _task(reader, path)


def registry(extra: tuple[str, ...] | None = None) -> dict[str, Task]:
    """Every task: the built-in definitions, then those in the folders of ``$ROPESERVE_TASKS_PATH``."""
    if extra is None:
        extra = tuple(p for p in os.environ.get(PATH_VARIABLE, "").split(os.pathsep) if p)
    return dict(_registry(extra))


@lru_cache(maxsize=8)
def _registry(extra: tuple[str, ...]) -> tuple[tuple[str, Task], ...]:
    tasks: dict[str, Task] = {}
    for folder in (BUILTIN_DIR, *map(Path, extra)):
        if not folder.is_dir():
            raise DefinitionError(f"{PATH_VARIABLE} names {folder}, which is not a folder")
        for path in sorted(folder.glob("*.toml")):
            task = load(path)
            if task.name in tasks:
                raise DefinitionError(f"{path}: task {task.name!r} is already defined in {tasks[task.name].source}")
            tasks[task.name] = task
    return tuple(tasks.items())


def get(name: str) -> Task:
    tasks = registry()
    try:
        return tasks[name]
    except KeyError:
        raise ValueError(f"task must be one of {', '.join(tasks)}, got {name!r}") from None


# -- parsing ---------------------------------------------------------------------------------------------


class _Reader:
    """Typed access to one table of the TOML document, with errors that name the file and the key."""

    def __init__(self, table: Mapping[str, Any], where: str) -> None:
        self.table = table
        self.where = where

    def fail(self, key: str, problem: str) -> DefinitionError:
        return DefinitionError(f"{self.where}: {key}: {problem}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.table:
            if default is ...:
                raise self.fail(key, "is required")
            return default
        value = self.table[key]
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise self.fail(key, f"must be {names}, got {value!r}")
        return value

    def sub(self, key: str, optional: bool = False) -> _Reader:
        """The table under `key` (an empty one when it is optional and absent)."""
        return _Reader(self.get(key, dict, {} if optional else ...), f"{self.where} [{key}]")

    def check_known(self, *known: str) -> None:
        unknown = sorted(set(self.table) - set(known))
        if unknown:
            raise self.fail(", ".join(unknown), f"unknown key (known: {', '.join(known)})")


def _tensor(raw: Any, where: str) -> Tensor:
    if not isinstance(raw, dict):
        raise DefinitionError(f'{where}: must be a table like {{ name = "X", type = "string" }}, got {raw!r}')
    r = _Reader(raw, where)
    r.check_known("name", "type", "dims", "note")
    kind = r.get("type", str)
    if kind not in TENSOR_TYPES:
        raise r.fail("type", f"must be one of {', '.join(TENSOR_TYPES)}, got {kind!r}")
    dims = r.get("dims", list, [1])
    if not dims or not all(isinstance(d, int) and (d > 0 or d == -1) for d in dims):
        raise r.fail("dims", f"must be a non-empty list of positive sizes or -1, got {dims!r}")
    return Tensor(r.get("name", str), kind, tuple(dims), r.get("note", str, ""))


def _tensors(r: _Reader, key: str) -> tuple[Tensor, ...]:
    items = r.get(key, list)
    if not items:
        raise r.fail(key, "must list at least one tensor")
    return tuple(_tensor(item, f"{r.where} {key}[{i}]") for i, item in enumerate(items))


def _option(keyword: str, r: _Reader) -> Option:
    r.check_known("input", "default", "range", "choices", "help", "flags")
    flags = tuple(r.get("flags", list, ["--" + keyword.replace("_", "-")]))
    if not all(isinstance(f, str) and f.startswith("--") for f in flags):
        raise r.fail("flags", f"must be command-line flags like '--{keyword}', got {list(flags)!r}")
    common = {"keyword": keyword, "input": r.get("input", str), "help": r.get("help", str), "flags": flags}
    if "choices" not in r.table:
        low, high = _pair(r, "range")
        default = r.get("default", int)
        if not low <= default <= high:
            raise r.fail("default", f"{default} is outside range [{low}, {high}]")
        return Option(**common, default=default, low=low, high=high)
    if "range" in r.table:
        raise r.fail("range/choices", "give one: range = [low, high] (an int option) or choices = [...] (a string)")
    choices = r.get("choices", list)
    if not choices or not all(isinstance(c, str) and c for c in choices) or len(set(choices)) != len(choices):
        raise r.fail("choices", f"must be a non-empty list of distinct non-empty strings, got {choices!r}")
    default = r.get("default", str)
    if default not in choices:
        raise r.fail("default", f"{default!r} is not one of the choices {choices!r}")
    return Option(**common, default=default, choices=tuple(choices))


def _pair(r: _Reader, key: str) -> tuple[int, int]:
    value = r.get(key, list)
    if len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in value) or value[0] > value[1]:
        raise r.fail(key, f"must be [low, high] integers with low <= high, got {value!r}")
    return value[0], value[1]


def _model(role: str, r: _Reader) -> OnnxModel:
    r.check_known(
        "name", "inputs", "outputs", "max_batch_size", "dynamic_batching", "instances", "threads", "export", "file",
        "about",
    )  # fmt: skip
    instances = r.sub("instances", optional=True)
    instances.check_known("cpu", "gpu")
    export, file = r.get("export", str, ""), r.get("file", str, "")
    if bool(export) == bool(file):
        raise r.fail("export/file", 'give exactly one: export = "module:function" or file = "model.onnx"')
    return OnnxModel(
        role=role,
        name=r.get("name", str),
        inputs=_tensors(r, "inputs"),
        outputs=_tensors(r, "outputs"),
        max_batch_size=r.get("max_batch_size", int, 0),
        dynamic_batching=r.get("dynamic_batching", bool, False),
        cpu_instances=instances.get("cpu", int, 1),
        gpu_instances=instances.get("gpu", int, 1),
        threads=r.get("threads", int, 2),
        export=export,
        file=file,
        about=r.get("about", str, ""),
    )


def _endpoint(
    name: str,
    r: _Reader,
    inherited: Mapping[str, OnnxModel],
    outputs: tuple[Tensor, ...] = (),
    decoupled: bool = False,
    contract: bool = False,
    reads_options: bool = True,
) -> Endpoint:
    """An endpoint's table; a twin inherits the task's models (and, for the stream, the outputs). A contract's
    (tasks/contract_file.py) holds only what clients read: its outputs and its description."""
    own_outputs = _tensors(r, "outputs") if "outputs" in r.table or not outputs else outputs
    if contract:
        r.check_known("outputs", "about")
        return Endpoint(
            name=name, front="", outputs=own_outputs, max_batch_size=0, instances=0, queue_size=0,
            queue_timeout_s=0.0, models={}, about=r.get("about", str, ""), decoupled=decoupled,
            reads_options=reads_options,
        )  # fmt: skip
    r.check_known(
        "front", "outputs", "max_batch_size", "instances", "queue", "models", "about", "graphs", "threads",
        "precision",
    )  # fmt: skip
    queue = r.sub("queue")
    queue.check_known("max_size", "timeout_s")
    models = dict(inherited)
    raw_models = r.sub("models", optional=True)
    for role, table in raw_models.table.items():
        models[role] = _model(role, _Reader(table, f"{raw_models.where}.{role}"))
    front = r.get("front", str)
    if ":" not in front:
        raise r.fail("front", f"must be 'module:Class', got {front!r}")
    return Endpoint(
        name=name,
        front=front,
        outputs=own_outputs,
        max_batch_size=r.get("max_batch_size", int),
        instances=r.get("instances", int, 2),
        queue_size=queue.get("max_size", int),
        queue_timeout_s=float(queue.get("timeout_s", (int, float))),
        models=models,
        about=r.get("about", str, ""),
        graphs=r.get("graphs", str, ""),
        threads=r.get("threads", int, 0),
        precision=_precision(r),
        decoupled=decoupled,
        reads_options=reads_options,
    )


def _precision(r: _Reader) -> str:
    precision = str(r.get("precision", str, "fp32"))
    if precision not in ("fp32", "int8"):
        raise r.fail("precision", f"must be fp32 or int8, got {precision!r}")
    return precision


def _loadtest(r: _Reader) -> LoadTexts:
    r.check_known("weight", "texts", "file", "column", "header", "paragraphs")
    texts = r.get("texts", list)
    if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise r.fail("texts", "must list at least one non-empty text (the load test's fallback)")
    return LoadTexts(
        weight=float(r.get("weight", (int, float), 1)),
        texts=tuple(texts),
        file=r.get("file", str, ""),
        column=r.get("column", (str, int), 0),
        header=r.get("header", bool, False),
        paragraphs=r.get("paragraphs", bool, False),
    )


MAY_BE_ZERO = ("prefix_cache_mib",)  # [engine] settings whose 0 turns something off


def _engine(r: _Reader) -> EngineSettings:
    defaults = EngineSettings()
    known = [f.name for f in fields(EngineSettings)]
    r.check_known(*known)
    values = {}
    for key in known:
        default = getattr(defaults, key)
        value = r.get(key, (int, float) if isinstance(default, float) else int, default)
        if value < 0 or (value == 0 and key not in MAY_BE_ZERO):
            raise r.fail(key, f"must be {'at least 0' if key in MAY_BE_ZERO else 'positive'}, got {value!r}")
        values[key] = type(default)(value)
    settings = EngineSettings(**values)
    if settings.max_queued_rows < settings.max_rows:
        raise r.fail(
            "max_queued_rows", f"must be at least max_rows ({settings.max_rows}), got {settings.max_queued_rows}"
        )
    return settings


def _prompt(r: _Reader) -> Prompt:
    r.check_known("instruction", "system")
    instruction = r.get("instruction", str)
    if instruction.count("{text}") != 1:
        raise r.fail("instruction", f"must hold {{text}} (where the text goes) exactly once, got {instruction!r}")
    return Prompt(instruction, r.get("system", str, ""))


def _task(r: _Reader, path: Path) -> Task:
    r.check_known(
        "summary", "example", "checkpoint", "assets", "result", "options", "endpoint", "explain", "stream", "loadtest",
        "engine", "contract", "prompt", "chat",
    )  # fmt: skip
    contract = r.get("contract", bool, False)  # only what clients read (tasks/contract_file.py): the SDK's copy
    name = path.stem
    if not name.isidentifier():
        raise DefinitionError(f"{path}: the file name must be a Python identifier (it names the SDK method)")
    raw_options = r.sub("options", optional=True)
    options = tuple(
        _option(keyword, _Reader(table, f"{raw_options.where}.{keyword}"))
        for keyword, table in raw_options.table.items()
    )
    endpoint = _endpoint(name, r.sub("endpoint"), {}, contract=contract)
    explain = None
    if "explain" in r.table:
        explain = _endpoint(f"{name}_explain", r.sub("explain"), endpoint.models, contract=contract)
    stream = None
    if "stream" in r.table:  # the endpoint's twin answering with a stream of pieces: its outputs, its own front
        twin = r.sub("stream")
        stream = _endpoint(f"{name}_stream", twin, endpoint.models, endpoint.outputs, decoupled=True, contract=contract)
    chat = None
    if "chat" in r.table:  # a chat request in, the answer streamed with why it ended and its token counts
        table = r.sub("chat")
        chat = _endpoint(f"{name}_chat", table, endpoint.models, decoupled=True, contract=contract, reads_options=False)
    task = Task(
        name=name,
        summary=r.get("summary", str),
        example=r.get("example", str),
        folder=path.parent,
        options=options,
        endpoint=endpoint,
        explain=explain,
        stream=stream,
        loadtest=LoadTexts(0.0, ()) if contract else _loadtest(r.sub("loadtest")),
        assets=tuple(r.get("assets", list, [])),
        checkpoint=r.get("checkpoint", str, ""),
        result=r.get("result", str, ""),
        engine=_engine(r.sub("engine", optional=True)),
        prompt=_prompt(r.sub("prompt")) if "prompt" in r.table else None,
        chat=chat,
        source=path,
    )
    if len(endpoint.outputs) > 1 and not task.result:
        raise r.fail("result", "is required when the endpoint has several outputs (it names the SDK's answer class)")
    return task
