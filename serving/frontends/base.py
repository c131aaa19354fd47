"""What every front model does, written once.

Triton's dynamic batcher hands `execute()` several requests. A front model:
  1. reads and validates each request on its own (a bad one gets an error response, the
     others go on),
  2. tokenizes all valid texts of the batch in one call of the Rust tokenizer,
  3. runs the task (one BLS call per group of requests that share settings),
  4. answers each request in order, one response per request, nothing dropped.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from serving.frontends.metrics import FrontMetrics
from serving.frontends.options import NoOptions, check_options
from serving.text.tokenizer import UNK_ID, UNKNOWN_PIECES_SUFFIX
from tasks.definition import TEXT_INPUT, Endpoint, Task
from tasks.definition import load as load_task

PAD_MULTIPLE = 8
# Triton 2.51 has no request-size flag, so the front models bound the work one text can cause: 1 MiB, a whole
# article or 100,000 Chinese characters. Within it, sentiment and summarize read at most 32 windows of a text and
# translate refuses a document over its own limits (serving/frontends/engine_front.py).
MAX_TEXT_BYTES = 1 << 20


class InputError(ValueError):
    """A problem with what the client sent; its message is returned to the client as INVALID_ARGUMENT.

    ``reason`` is a short fixed label for the ``ropeserve_rejected_requests_total`` metric
    (one of :data:`serving.frontends.metrics.REJECT_REASONS`); the message holds the details.
    """

    def __init__(self, message: str, reason: str = "invalid_input") -> None:
        super().__init__(message)
        self.reason = reason


class Overloaded(Exception):
    """A valid request refused for now: its message is returned as UNAVAILABLE, which the SDK retries."""


def decode_texts(raw: np.ndarray, name: str = TEXT_INPUT) -> list[str]:
    """BYTES tensor [N, 1] → N Python strings, refusing invalid UTF-8 and empty text."""
    arr = np.asarray(raw)
    if arr.dtype != np.object_:
        raise InputError(f"{name} must be BYTES (UTF-8 text), got {arr.dtype}", "bad_datatype")
    if arr.ndim != 2 or arr.shape[1] != 1:
        raise InputError(f"{name} must have shape [batch, 1], got {list(arr.shape)}", "bad_shape")
    texts = []
    for i, item in enumerate(arr[:, 0]):
        raw = item.encode("utf-8", "surrogatepass") if isinstance(item, str) else item
        if isinstance(raw, bytes | bytearray) and len(raw) > MAX_TEXT_BYTES:
            raise InputError(
                f"{name}[{i}] is {len(raw):,} bytes; the limit is {MAX_TEXT_BYTES:,} bytes per text "
                "(longer texts are truncated to the model's maximum length anyway)",
                "text_too_large",
            )
        if isinstance(item, bytes | bytearray):
            try:
                text = bytes(item).decode("utf-8")
            except UnicodeDecodeError as err:
                raise InputError(
                    f"{name}[{i}] is not valid UTF-8 ({err.reason} at byte {err.start})", "invalid_utf8"
                ) from None
        elif isinstance(item, str):
            text = item
        else:
            raise InputError(f"{name}[{i}] must be UTF-8 bytes, got {type(item).__name__}", "bad_datatype")
        if not has_readable_char(text):
            raise InputError(f"{name}[{i}] is empty, whitespace-only or holds only control characters", "empty_text")
        texts.append(text)
    return texts


def has_readable_char(text: str) -> bool:
    """False when the tokenizer's normalizer would leave nothing: whitespace, control and
    format characters (category Cc/Cf) and U+FFFD are all it removes or ignores."""
    return any(not (ch.isspace() or ch == "\ufffd" or unicodedata.category(ch) in ("Cc", "Cf")) for ch in text)


def decode_int_option(raw: np.ndarray | None, name: str, rows: int, default: int, low: int, high: int) -> int:
    """An optional INT32 [N, 1] setting: one value for the whole request, inside [low, high]."""
    if raw is None:
        return default
    arr = np.asarray(raw)
    if arr.size not in (1, rows):
        raise InputError(
            f"{name} must hold one value per text (shape [{rows}, 1]), got shape {list(arr.shape)}", "bad_shape"
        )
    values = set(arr.reshape(-1).tolist())
    if len(values) != 1:
        raise InputError(
            f"{name} must be the same for every text of a request, got {sorted(values)}", "option_mismatch"
        )
    value = int(values.pop())
    if not low <= value <= high:
        raise InputError(f"{name} must be between {low} and {high}, got {value}", "option_out_of_range")
    return value


def decode_choice_option(raw: np.ndarray | None, name: str, rows: int, default: str, choices: Sequence[str]) -> str:
    """An optional BYTES [N, 1] setting: one UTF-8 value for the whole request, one of `choices`.

    A value outside the choices counts as "option_out_of_range", like an int outside its range: one reason for
    "a setting the task does not accept", whatever its type.
    """
    if raw is None:
        return default
    arr = np.asarray(raw)
    allowed = ", ".join(choices)
    if arr.dtype != np.object_:
        raise InputError(f"{name} must be BYTES (UTF-8 text: one of {allowed}), got {arr.dtype}", "bad_datatype")
    if arr.size not in (1, rows):
        raise InputError(
            f"{name} must hold one value per text (shape [{rows}, 1]), got shape {list(arr.shape)}", "bad_shape"
        )
    values: set[str] = set()
    for item in arr.reshape(-1).tolist():
        if isinstance(item, str):
            values.add(item)
            continue
        if not isinstance(item, bytes | bytearray):
            raise InputError(f"{name} must be UTF-8 bytes, got {type(item).__name__}", "bad_datatype")
        try:
            values.add(bytes(item).decode("utf-8"))
        except UnicodeDecodeError as err:
            raise InputError(f"{name} is not valid UTF-8 ({err.reason} at byte {err.start})", "invalid_utf8") from None
    if len(values) != 1:
        raise InputError(
            f"{name} must be the same for every text of a request, got {sorted(values)}", "option_mismatch"
        )
    value = values.pop()
    if value not in choices:
        raise InputError(f"{name} must be one of {allowed}, got {value!r}", "option_out_of_range")
    return value


@dataclass
class Encoded:
    """A padded batch: ids/mask [B, S] int64 with S a multiple of 8, plus per-row bookkeeping."""

    ids: np.ndarray
    mask: np.ndarray
    lengths: list[int]
    truncated: list[bool]

    def take(self, rows: Sequence[int]) -> Encoded:
        """These rows only, padded to their own longest (a multiple of 8)."""
        lengths = [self.lengths[r] for r in rows]
        width = padded_width(max(lengths))
        return Encoded(self.ids[rows, :width], self.mask[rows, :width], lengths, [self.truncated[r] for r in rows])


def padded_width(longest: int) -> int:
    return max(PAD_MULTIPLE, -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE)


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int = 0, truncated: list[bool] | None = None) -> Encoded:
    """Rows of token ids as one padded batch, a multiple of PAD_MULTIPLE wide."""
    lengths = [len(row) for row in rows]
    ids = np.full((len(rows), padded_width(max(lengths))), pad_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for number, row in enumerate(rows):
        ids[number, : len(row)] = row
        mask[number, : len(row)] = 1
    return Encoded(ids, mask, lengths, truncated or [False] * len(rows))


# Texts of a batch differ in length (the benchmark's sentiment reviews: 20.5 tokens at the median, 82 at p90, cut
# at 128), and one padded batch makes every row as long as the longest. Rows are grouped by padded width instead,
# one encoder call per group: the encoder's time grows with the tokens it is given, padding included, while an
# in-process call adds little beyond them (coarser groups, merged to at least 4 rows, served fewer texts per second).


def length_buckets(lengths: Sequence[int]) -> list[list[int]]:
    """Row indices grouped by padded width, shortest first; every row in exactly one group."""
    groups: dict[int, list[int]] = {}
    for row in sorted(range(len(lengths)), key=lengths.__getitem__):
        groups.setdefault(padded_width(lengths[row]), []).append(row)
    return list(groups.values())


class BatchTokenizer:
    """One `encode_batch` call for all texts of a Triton batch, truncation, one padding.

    A tokenizer may come with a table of unknown pieces (``<name>.unknown_pieces.json`` beside it, written by the
    Marian importer): a run of characters its model does not know is one unknown token, and where the run's
    normalized text is in that table it takes the table's id instead, as MarianTokenizer looks such a run up in
    its vocabulary."""

    def __init__(
        self, tokenizer: Tokenizer, max_tokens: int, pad_id: int = 0, unknown_pieces: dict[str, int] | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.pad_id = pad_id
        self.unknown_pieces = unknown_pieces or {}

    @classmethod
    def from_file(cls, path: Path, max_tokens: int) -> BatchTokenizer:
        table = Path(path).with_suffix(UNKNOWN_PIECES_SUFFIX)
        pieces = json.loads(table.read_text(encoding="utf-8")) if table.is_file() else None
        return cls(Tokenizer.from_file(str(path)), max_tokens, unknown_pieces=pieces)

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids, no special tokens added."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        if not self.unknown_pieces:
            return [encoding.ids for encoding in encodings]
        return [self._known(text, encoding) for text, encoding in zip(texts, encodings)]

    def _known(self, text: str, encoding: Any) -> list[int]:
        ids = list(encoding.ids)
        for i, (token, (start, end)) in enumerate(zip(ids, encoding.offsets)):
            if token == UNK_ID:
                surface = self.tokenizer.normalizer.normalize_str(text[start:end])
                ids[i] = self.unknown_pieces.get(surface, UNK_ID)
        return ids

    def encode(self, texts: Sequence[str], suffix: Sequence[int] = ()) -> Encoded:
        """Token ids (plus `suffix`, e.g. an end-of-sequence id) truncated to max_tokens."""
        all_ids = self.token_ids(texts)
        keep = self.max_tokens - len(suffix)
        # An empty encoding would leave a row with every key masked; read it as one unknown token.
        seqs = [(ids[:keep] or [UNK_ID]) + list(suffix) for ids in all_ids]
        truncated = [len(ids) > keep for ids in all_ids]
        return pad_rows(seqs, self.pad_id, truncated)

    def token_ends(self, texts: Sequence[str]) -> list[list[int]]:
        """Per text, the character offset where each of its tokens ends (before truncation)."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [[end for _, end in encoding.offsets] for encoding in encodings]


@dataclass
class ParsedRequest:
    """One valid request: its texts and the settings that decide which BLS call it joins."""

    index: int  # position of the request in the Triton batch
    texts: list[str]
    options: Any = NoOptions()  # the front model's Options


def version_folder(args: dict) -> Path:
    """The folder of a front model instance's version: model.py, the task definition and its assets."""
    return Path(args["model_repository"]) / str(args["model_version"])


def read_endpoint(folder: Path, name: str) -> tuple[Task, Endpoint]:
    """The task defined in ``folder`` (its ``<task>.toml``, copied there by export.build_repository) and its
    endpoint called ``name`` (the task's own, or its explain twin)."""
    definitions = sorted(folder.glob("*.toml"))
    if len(definitions) != 1:
        raise ValueError(f"{folder} must hold exactly one task definition (*.toml), found {len(definitions)}")
    task = load_task(definitions[0])
    for endpoint in task.endpoints():
        if endpoint.name == name:
            return task, endpoint
    raise ValueError(f"{definitions[0]} defines no endpoint {name!r}")


# How long the answer thread waits after execute() returned before it sends: the stub's return has to reach
# Triton, which then frees the instance. Without it, at 32 clients about one batch in a hundred still raced ahead.
RELEASE_WAIT_S = 0.0005
# The model-config parameter that overrides the rule of `sends_after_execute`: "auto" (the default), "true", "false".
SEND_AFTER_EXECUTE = "send_answers_after_execute"


def sends_after_execute(model_config: dict) -> bool:
    """Whether a front model should send its answers after ``execute()`` returns rather than return them.

    Triton 2.51's dynamic batcher, once a model has a queue policy, is not woken when an instance frees; returned
    answers reach the clients before Triton frees the instance, so with a single instance the clients' next
    requests arrive while it is busy and wait for the batcher's 500 ms idle wait. Sent from a thread shortly after
    ``execute()`` returns, they usually arrive after the instance is free: a race made rare, not impossible
    (docs/reliability.md, "the price of the queue bound"). The price: an answer computed but not yet sent when the
    stub is killed is never sent (the client's deadline ends that request), where returned answers get Triton's
    error. With two or more instances the stall does not show, so those return their answers. The parameter
    ``send_answers_after_execute`` ("true" or "false") overrides this rule.
    """
    parameters = model_config.get("parameters") or {}
    setting = (parameters.get(SEND_AFTER_EXECUTE) or {}).get("string_value", "auto")
    if setting not in {"auto", "true", "false"}:
        raise ValueError(f"parameter {SEND_AFTER_EXECUTE} must be auto, true or false, got {setting!r}")
    if setting != "auto":
        return setting == "true"
    groups = model_config.get("instance_group") or [{}]
    instances = sum(int(group.get("count", 1)) for group in groups)
    policy = (model_config.get("dynamic_batching") or {}).get("default_queue_policy") or {}
    bounded = any(int(policy.get(key, 0) or 0) > 0 for key in ("max_queue_size", "default_timeout_microseconds"))
    return instances == 1 and bounded


class FrontModel:
    """Template for a front model; subclasses say how to run a group of texts that share options.

    `pb` is the `triton_python_backend_utils` module, passed in because it only exists inside
    the Python backend stub. The task definition (``<task>.toml`` beside model.py) says which options to read,
    the outputs, and the ONNX models to call (``self.models``: role -> model name); ``self.task_config`` is the
    checkpoint's config.json, when the task ships one. `self.metrics` reports to Triton's custom metrics (see
    :mod:`serving.frontends.metrics`); subclasses tokenize through :meth:`encode` so input tokens and
    truncations are counted, and report generated tokens themselves. ``Options`` is the class a request's options
    arrive as (:mod:`serving.frontends.options`).
    """

    Options: type = NoOptions

    def __init__(self, pb: Any, args: dict) -> None:
        self.pb = pb
        self.model_config = json.loads(args["model_config"])
        name = self.model_config.get("name", args.get("model_name", "unknown"))
        self.asset_dir = version_folder(args)
        self.task, self.endpoint = read_endpoint(self.asset_dir, name)
        keywords = [option.keyword for option in self.task.options] if self.endpoint.reads_options else []
        check_options(self.Options, keywords, f"{name} ({type(self).__name__})")
        self.outputs = tuple(tensor.name for tensor in self.endpoint.outputs)
        self.models = {role: model.name for role, model in self.endpoint.models.items()}
        config_json = self.asset_dir / "config.json"
        self.task_config = json.loads(config_json.read_text(encoding="utf-8")) if config_json.is_file() else {}
        self.metrics = FrontMetrics(pb, name, args.get("model_instance_name", name))
        self.parameters = {k: v["string_value"] for k, v in self.model_config.get("parameters", {}).items()}
        self._sends_after_execute = sends_after_execute(self.model_config)
        self._answers: queue.SimpleQueue[list[tuple[Any, Any]]] | None = None  # started by the first execute()

    def finalize(self) -> None:
        """The model is unloading: send the last metric updates. (Triton unloads once every request has its final
        answer, so no answer is still queued here: tests/reliability/test_single_instance.py.)"""
        self.metrics.close()

    def graph_threads(self) -> int:
        """ONNX Runtime intra-op threads of the graphs the front model runs itself (the definition's `threads`)."""
        return int(self.parameters.get("intra_op_thread_count", "1"))

    def encode(self, tokenizer: BatchTokenizer, texts: Sequence[str], suffix: Sequence[int] = ()) -> Encoded:
        """`tokenizer.encode`, counted in the input-token and truncation metrics."""
        batch = tokenizer.encode(texts, suffix)
        self.metrics.encoded(batch.lengths, batch.truncated)
        return batch

    def parse_options(self, request: Any, rows: int) -> Any:
        """The request's options as an ``Options``: each option of the task, its default where not sent. An int
        option's value is an int, a string option's a str."""
        values: dict[str, int | str] = {}
        for option in self.task.options:
            tensor = self.pb.get_input_tensor_by_name(request, option.input)
            raw = None if tensor is None else tensor.as_numpy()
            if option.choices:
                value = decode_choice_option(raw, option.input, rows, option.default, option.choices)
            else:
                value = decode_int_option(raw, option.input, rows, option.default, option.low, option.high)
            values[option.keyword] = value
        return self.Options(**values)

    def read_request(self, request: Any) -> tuple[list[str], Any]:
        """A request's texts and options, validated; `InputError` names what is wrong."""
        tensor = self.pb.get_input_tensor_by_name(request, TEXT_INPUT)
        if tensor is None:
            raise InputError(f"missing required input {TEXT_INPUT}", "missing_input")
        texts = decode_texts(tensor.as_numpy())
        return texts, self.parse_options(request, len(texts))

    # -- task specific -------------------------------------------------------------------
    def run_group(self, texts: list[str], options: Any) -> list[tuple]:
        """Results for texts that share `options` (an ``Options``), one tuple of output values per text."""
        raise NotImplementedError

    def runs_as_group(self, options: Any) -> bool:
        """Whether requests with these options are answered by :meth:`run_group`, every request of the batch that
        shares them in one call; otherwise :meth:`submit` takes each on."""
        return True

    def submit(self, request: Any, texts: list[str], options: Any) -> None:
        """Take on a valid request, answered later through its response sender (the generation engine's front
        models). Raise :class:`InputError` (refused by name) or :class:`Overloaded` before taking it on."""
        raise NotImplementedError

    # -- shared flow ---------------------------------------------------------------------
    def execute(self, requests: list[Any]) -> list[Any] | None:
        """Every request's answer: returned, or (see :func:`sends_after_execute`) sent once this returns."""
        responses = self.answer(requests)
        if not self._sends_after_execute:
            return responses
        if self._answers is None:
            self._answers = queue.SimpleQueue()
            threading.Thread(target=self._send_answers, name="front-answers", daemon=True).start()
        self._answers.put([(request.get_response_sender(), response) for request, response in zip(requests, responses)])
        return None

    def _send_answers(self) -> None:
        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        while True:
            answers = self._answers.get()
            time.sleep(RELEASE_WAIT_S)
            for sender, response in answers:
                try:
                    sender.send(response, flags=final)
                except Exception as err:  # noqa: BLE001 - one failed send must not stop every later answer
                    print(f"ropeserve: {self.metrics.instance}: sending an answer failed: {err}", file=sys.stderr)

    def answer(self, requests: list[Any]) -> list[Any]:
        """Every request read and validated once, then answered in its group (:meth:`run_group`) or taken on
        (:meth:`submit`): each request's response, or None for those taken on."""
        responses: list[Any] = [None] * len(requests)
        groups: dict[Any, list[ParsedRequest]] = {}  # options -> the requests that share them
        self.metrics.requests(len(requests))
        accepted = 0
        for i, request in enumerate(requests):
            try:
                parsed = ParsedRequest(i, *self.read_request(request))
                if self.runs_as_group(parsed.options):
                    groups.setdefault(parsed.options, []).append(parsed)
                else:
                    self.submit(request, parsed.texts, parsed.options)
                accepted += len(parsed.texts)
            except InputError as err:
                responses[i] = self.error_response(str(err))
                self.metrics.rejected(err.reason)
            except Overloaded as err:
                error = self.pb.TritonError(str(err), self.pb.TritonError.UNAVAILABLE)
                responses[i] = self.pb.InferenceResponse(error=error)
                self.metrics.rejected("overloaded")
        self.metrics.batch(accepted)
        for options, members in groups.items():
            texts = [t for parsed in members for t in parsed.texts]
            try:
                results = self.run_group(texts, options)
            except InputError as err:  # a group-level problem: tell each request of the group
                for parsed in members:
                    responses[parsed.index] = self.error_response(str(err))
                    self.metrics.rejected(err.reason)
                continue
            except Exception as err:  # noqa: BLE001 - a server fault must answer, not hang the client
                for parsed in members:
                    responses[parsed.index] = self.internal_error_response(err)
                continue
            start = 0
            for parsed in members:
                rows = results[start : start + len(parsed.texts)]
                start += len(parsed.texts)
                responses[parsed.index] = self.ok_response(rows)
        return responses

    def ok_response(self, rows: list[tuple]) -> Any:
        columns = list(zip(*rows)) if rows else [() for _ in self.outputs]
        tensors = [
            self.pb.Tensor(name, to_column(values, self.output_dtype(name)))
            for name, values in zip(self.outputs, columns)
        ]
        return self.pb.InferenceResponse(output_tensors=tensors)

    def error_response(self, message: str, invalid: bool = True) -> Any:
        code = self.pb.TritonError.INVALID_ARG if invalid else self.pb.TritonError.INTERNAL
        return self.pb.InferenceResponse(error=self.pb.TritonError(message, code))

    def internal_error_response(self, err: object) -> Any:
        """The answer to a request that failed on the server's side (counted as internal_error)."""
        self.metrics.rejected("internal_error")
        return self.error_response(f"internal error: {err}", invalid=False)

    def output_dtype(self, name: str) -> Any:
        for out in self.model_config["output"]:
            if out["name"] == name:
                return self.pb.triton_string_to_numpy(out["data_type"])
        raise KeyError(name)

    def bls(self, model: str, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """One synchronous call of another model of the repository."""
        request = self.pb.InferenceRequest(
            model_name=model,
            inputs=[self.pb.Tensor(k, v) for k, v in inputs.items()],
            requested_output_names=outputs,
        )
        response = request.exec()
        if response.has_error():
            raise RuntimeError(f"{model}: {response.error().message()}")
        return {name: self.pb.get_output_tensor_by_name(response, name).as_numpy() for name in outputs}


def to_column(values: Sequence[Any], dtype: Any) -> np.ndarray:
    """Values → [N, 1] array; strings become UTF-8 bytes for BYTES outputs."""
    if dtype in (np.object_, object, np.bytes_):
        data = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
        return np.array(data, dtype=np.object_).reshape(-1, 1)
    return np.asarray(values, dtype=dtype).reshape(-1, 1)
