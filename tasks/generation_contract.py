"""The generation model contract: the graphs a translation or summarization model hands the engine.

Written once, here, and read by both sides: the exporters write graphs to it (export/graphs/step_export.py for our
own checkpoints, export/import_hf/ for Hugging Face ones) and the continuous-batching engine (serving/engine/) runs
whatever satisfies it, naming no tensor itself. `python -m tasks check` validates a built repository against it.

encoder (``encoder.onnx``)
    inputs   input_ids int32 [B, S]: the source tokenizer's ids, ending with its end-of-sequence id, right-padded
             with 0; attention_mask int32 [B, S] (1 = token). A model whose own ids differ maps them inside the
             graph, so the serving side has one id space per tokenizer.
    outputs  cross_{key,value}_i float32 [B, H, S, Dh], one pair per cross-attention the decoder reads
             (:func:`cross_names`): the source's keys and values, projected once.
decoder step (``decoder.onnx``)
    inputs   input_ids int32 [R, 1]: each row's newest token (the decoder start token first); positions int64 [R]:
             the keys each row has cached; cross_mask int32 [N, S]; past_{key,value}_self_i float32 [R, H, C, Dh]:
             row r's cache in columns 0..positions[r]-1 of a buffer of C > max(positions) columns; the encoder's
             cross pairs [N, H, S, Dh], once per source with R = N · rows per source (a source's rows
             consecutive), or once per row (N = R).
    outputs  log_probs float32 [R, V] (V static: the vocabulary): each row's next-token log-probabilities, with
             the tokens the model may never produce at -inf; top_log_probs float32 / top_ids int64 [R, TOP_K]:
             the TOP_K best, best first; present_{key,value}_self_i [R, H, C, Dh]: the buffer with each row's new
             key and value at column positions[r]. The engine binds each present to its past's memory, so the
             graph must write in place (com.microsoft::GroupQueryAttention does).

A decoder-only model (a causal LM: Qwen2, Llama) hands the engine the decoder step alone, without
cross-attention, which reads its prompt too, a chunk at a time:

decoder step (``decoder.onnx``, no ``encoder.onnx`` beside it)
    inputs   input_ids int32 [R, S]: S ≥ 1 new tokens per row, at positions positions[r] .. positions[r] + S - 1,
             and past_{key,value}_self_i float32 [R, Hkv, C, Dh] as above (no cross_mask, no cross pairs; Hkv: the
             model's key/value heads, grouped as it groups them). A prompt is fed in chunks of S tokens, one row
             per call while its cache holds keys (ONNX Runtime's GroupQueryAttention continues a cache with
             several tokens for one row at a time); a row with fewer new tokens than S is right-padded, and its
             padding's keys, written after its own, are overwritten by its next call or never read. Decoding
             feeds one token per row, every row at once.
    outputs  as above, the log-probabilities of each row's last column (a decode step's token; a chunk's are
             not read).

Beam search over k beams reads each row's 2·k best tokens, so the graphs' TOP_K bounds the beams: MAX_BEAMS.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_BEAMS = 8
TOP_K = 2 * MAX_BEAMS  # a beam search of k beams reads 2·k candidates per row

ENCODER_FILE, DECODER_FILE = "encoder.onnx", "decoder.onnx"
INT8_FILES = {ENCODER_FILE: "encoder.int8.onnx", DECODER_FILE: "decoder.int8.onnx"}

INPUT_IDS, ATTENTION_MASK = "input_ids", "attention_mask"
POSITIONS, CROSS_MASK = "positions", "cross_mask"
LOG_PROBS, TOP_LOG_PROBS, TOP_IDS = "log_probs", "top_log_probs", "top_ids"

# ONNX element types by name (onnx.TensorProto values), so this module needs no onnx import to be read
INT32, INT64, FLOAT = 6, 7, 1


def graph_files(precision: str = "fp32", decoder_only: bool = False) -> tuple[str, ...]:
    """The file names of the graphs for a precision ("fp32" or "int8"): the encoder's and the decoder step's, or
    a decoder-only model's step alone. The step is always last."""
    names = (DECODER_FILE,) if decoder_only else (ENCODER_FILE, DECODER_FILE)
    if precision == "int8":
        return tuple(INT8_FILES[name] for name in names)
    if precision == "fp32":
        return names
    raise ValueError(f"precision must be fp32 or int8, got {precision!r}")


def is_decoder_only(folder: Path) -> bool:
    """Whether the graphs in `folder` are a decoder-only model's: a decoder step (fp32 or int8) and no encoder."""
    has = [(Path(folder) / name).is_file() for name in (ENCODER_FILE, INT8_FILES[ENCODER_FILE])]
    return not any(has) and any((Path(folder) / name).is_file() for name in (DECODER_FILE, INT8_FILES[DECODER_FILE]))


def cross_names(n_pairs: int) -> list[str]:
    """cross_key_0, cross_value_0, cross_key_1, ...: the encoder's outputs, the decoder's last inputs."""
    return [f"cross_{kv}_{i}" for i in range(n_pairs) for kv in ("key", "value")]


def self_cache_names(prefix: str, n_layers: int) -> list[str]:
    """past_key_self_0, past_value_self_0, ... (prefix "past") or present_... (prefix "present")."""
    return [f"{prefix}_{kv}_self_{i}" for i in range(n_layers) for kv in ("key", "value")]


def encoder_inputs() -> list[str]:
    return [INPUT_IDS, ATTENTION_MASK]


def decoder_inputs(n_layers: int, n_cross: int) -> list[str]:
    """The step's inputs; with no cross pairs (a decoder-only model) no cross_mask either."""
    if n_cross == 0:
        return [INPUT_IDS, POSITIONS, *self_cache_names("past", n_layers)]
    return [INPUT_IDS, POSITIONS, CROSS_MASK, *self_cache_names("past", n_layers), *cross_names(n_cross)]


def decoder_outputs(n_layers: int) -> list[str]:
    return [LOG_PROBS, TOP_LOG_PROBS, TOP_IDS, *self_cache_names("present", n_layers)]


@dataclass(frozen=True)
class Layout:
    """What the engine allocates its buffers with, read from the decoder graph itself."""

    n_layers: int  # self-attention caches
    n_cross: int  # cross-attention (key, value) pairs; 0 for a decoder-only model
    n_heads: int  # of the self-attention cache: key/value heads
    head_dim: int
    vocab: int
    top_k: int

    @property
    def max_beams(self) -> int:
        return self.top_k // 2

    @property
    def decoder_only(self) -> bool:
        return self.n_cross == 0


def layout(inputs: dict[str, list[int | str]], outputs: dict[str, list[int | str]]) -> Layout:
    """The layout of a decoder graph from its inputs' and outputs' shapes (name → dims, a dim an int when static);
    raises ValueError naming what breaks the contract."""
    n_layers = sum(1 for name in inputs if name.startswith("past_key_self_"))
    n_cross = sum(1 for name in inputs if name.startswith("cross_key_"))
    expected_in, expected_out = decoder_inputs(n_layers, n_cross), decoder_outputs(n_layers)
    if list(inputs) != expected_in:
        raise ValueError(f"decoder inputs are {list(inputs)}; the contract wants {expected_in}")
    if list(outputs) != expected_out:
        raise ValueError(f"decoder outputs are {list(outputs)}; the contract wants {expected_out}")
    _, heads, _, head_dim = inputs["past_key_self_0"] if n_layers else (0, 0, 0, 0)
    vocab, top_k = outputs[LOG_PROBS][1], outputs[TOP_IDS][1]
    dims = {"heads": heads, "head_dim": head_dim, "vocabulary": vocab, "top-k": top_k}
    static = {what: dim for what, dim in dims.items() if isinstance(dim, int)}
    dynamic = [what for what in dims if what not in static]
    if n_layers == 0 or dynamic:
        raise ValueError(f"decoder must have self-attention caches with static {', '.join(dims)} (dynamic: {dynamic})")
    if static["top-k"] < 2:
        raise ValueError(f"decoder's {TOP_IDS} holds {top_k} tokens per row; beam search needs at least 2")
    return Layout(n_layers, n_cross, static["heads"], static["head_dim"], static["vocabulary"], static["top-k"])


def check_graphs(folder: Path, precision: str = "fp32") -> list[str]:
    """Where the step graphs in `folder` break the contract (empty: none). Reads the graphs' declared inputs and
    outputs only (onnx, no weights loaded)."""
    import onnx

    problems = []
    shapes = {}
    decoder_only = is_decoder_only(folder)
    roles = ("decoder",) if decoder_only else ("encoder", "decoder")
    for role, name in zip(roles, graph_files(precision, decoder_only)):
        path = Path(folder) / name
        if not path.is_file():
            problems.append(f"{path} is missing")
            continue
        graph = onnx.load(str(path), load_external_data=False).graph
        weights = {init.name for init in graph.initializer}
        shapes[role] = (
            {i.name: (i.type.tensor_type.elem_type, _dims(i)) for i in graph.input if i.name not in weights},
            {o.name: (o.type.tensor_type.elem_type, _dims(o)) for o in graph.output},
        )
    if problems:
        return problems
    dec_in, dec_out = shapes["decoder"]
    where = f"{folder}"
    try:
        found = layout({k: d for k, (_, d) in dec_in.items()}, {k: d for k, (_, d) in dec_out.items()})
    except ValueError as err:
        return [f"{where}: {err}"]
    if decoder_only != found.decoder_only:
        problems.append(f"{where}: no encoder graph beside a decoder of {found.n_cross} cross-attention pairs")
    if decoder_only and isinstance(dec_in[INPUT_IDS][1][1], int):
        problems.append(
            f"{where}: the decoder-only step reads {dec_in[INPUT_IDS][1][1]} token(s) per row; the contract wants "
            "a dynamic count (a prompt is read in chunks): import the model again"
        )
    if not decoder_only:
        enc_in, enc_out = shapes["encoder"]
        if list(enc_in) != encoder_inputs():
            problems.append(f"{where}: encoder inputs are {list(enc_in)}; the contract wants {encoder_inputs()}")
        if list(enc_out) != cross_names(found.n_cross):
            problems.append(
                f"{where}: encoder outputs are {list(enc_out)}; the decoder reads {cross_names(found.n_cross)}"
            )
        problems += _typed(where, "encoder", enc_in, {INPUT_IDS: INT32, ATTENTION_MASK: INT32})
    types = {INPUT_IDS: INT32, POSITIONS: INT64, CROSS_MASK: INT32}
    problems += _typed(where, "decoder", dec_in, types)
    problems += _typed(where, "decoder", dec_out, {LOG_PROBS: FLOAT, TOP_LOG_PROBS: FLOAT, TOP_IDS: INT64})
    return problems


def _dims(value: Any) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]


def _typed(where: str, role: str, tensors: dict[str, Any], types: dict[str, int]) -> list[str]:
    names = {INT32: "int32", INT64: "int64", FLOAT: "float32"}
    return [
        f"{where}: {role} {name} is type {tensors[name][0]}, the contract wants {names[kind]}"
        for name, kind in types.items()
        if name in tensors and tensors[name][0] != kind
    ]
