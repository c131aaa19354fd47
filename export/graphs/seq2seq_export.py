"""Seq2Seq → one ONNX generator: ONNX Runtime's `com.microsoft.BeamSearch` over our own subgraphs.

Generation runs inside one graph (no per-token round trips): the BeamSearch op (model_type=1, the
T5 contract) calls an *encoder* subgraph once and a *decoder* subgraph once per token, keeps the
beams, reorders the KV cache and applies the length penalty. Greedy decoding is num_beams = 1.
Every attention in the subgraphs is one fused `com.microsoft::MultiHeadAttention` node (see
export/model/attention.py); the files load in ONNX Runtime 1.19.2 (NGC tritonserver:24.10) and 1.31.

Generator model I/O (what the serving front model sends in its BLS request)
--------------------------------------------------------------------------
inputs
    input_ids       int32  [batch, sequence]  source ids, right-padded with pad_id (0); the front
                                              model's tokenizer output as is (ends with eos)
    attention_mask  int32  [batch, sequence]  1 = token, 0 = padding
    max_length      int32  [1]                decoder length INCLUDING the start token (bos), i.e.
                                              max_new_tokens + 1. Clamped inside the graph to
                                              [3, max_len]: ORT's T5 loop needs >= 3, and RoPE
                                              tables cover max_len positions.
    num_beams       int32  [1]                1 = greedy, k > 1 = beam search (ORT allows <= 128)
outputs
    sequences       int32  [batch, 1, max_length]  bos, then the generated tokens, then pad_id
                                                   filling; eos is never included. Strip position 0
                                                   and cut at the first pad (`serving.text.tokenizer.strip_generated`).

max_length and num_beams are shape-[1] tensors that apply to the whole batch, so the generator is
not batchable by Triton (config: max_batch_size 0); the front model batches and calls it once.
Fixed at export time (attributes or constants inside the graph): num_return_sequences = 1,
min_length = 0, length_penalty (default 1.0), repetition_penalty (default 1.0), early_stopping
(default on), no_repeat_ngram_size (default 0 = off), eos/pad/decoder-start ids from the model config.

Subgraph contract (ORT's T5 "old format", the one both 1.19 and current ORT accept)
---------------------------------------------------------------------------------
encoder: encoder_input_ids int32 [B, S], encoder_attention_mask int32 [B, S],
         decoder_input_ids int32 [B, 1] (bos)
      → logits [B, 1, V], encoder_hidden_states [B, S, D],
        present_{key,value}_self_i [B, H, 1, Dh], present_{key,value}_cross_i [B, H, S, Dh]
         (it encodes, projects cross-attention keys/values once and runs the first decoder step)
decoder: input_ids int32 [B, 1] (static 1: ORT then feeds only the newest token),
         encoder_attention_mask int32 [B, S],
         past_{key,value}_self_i [B, H, P, Dh], past_{key,value}_cross_i [B, H, S, Dh]
      → logits [B, 1, V], present_{key,value}_self_i [B, H, P+1, Dh]
Here B = batch (encoder) or batch * num_beams (decoder). V, H and Dh must be static in the output
shapes: ORT reads num_heads, head_size and vocab_size from them. The source length S must not exceed
cfg.max_len (the RoPE tables); the front model truncates.

What ONNX Runtime 1.19.2 (NGC 24.10) needs, measured against 1.31.1
------------------------------------------------------------------
- Cross-attention padding: 1.19's CPU MultiHeadAttention ignores key_padding_mask when query and key
  lengths differ (any mask shape), so cross-attention masks with an additive bias [B, H, T, S]
  (1.19 insists on all four dims; 1.31 would broadcast). Encoder self-attention keeps the int32
  key_padding_mask, which both versions honour.
- Weights: the decoder's weights are stored twice (both subgraphs run decoder steps). Moving them to
  the main graph as outer-scope initializers works in 1.31 (-34% file size, same speed) but 1.19
  refuses to load it ("does not have type information set by parent node").
- Both versions: min_length must be fed although optional (the kernel checks input 2 under the name
  max_length), and max_length 2 crashes (no decoder step runs), hence the clamp to >= 3. The decoder
  subgraph without an encoder_hidden_states input is accepted by both.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import Tensor, nn

from export.graphs.onnx_export import OPSET, quiet_exporter
from export.model.attention import KV, using_attention
from export.model.transformer import Seq2Seq
from serving.text.tokenizer import strip_generated

MS_DOMAIN = "com.microsoft"
MIN_MAX_LENGTH = 3  # ORT's T5 beam search runs no decoder step with max_length 2 and then fails
GENERATOR_INPUTS = ("input_ids", "attention_mask", "max_length", "num_beams")


def _kv_names(prefix: str, kind: str, n_layers: int) -> list[str]:
    """present_key_self_0, present_value_self_0, present_key_self_1, ... (key/value per layer)."""
    return [f"{prefix}_{kv}_{kind}_{i}" for i in range(n_layers) for kv in ("key", "value")]


def _flat(kvs: list[KV]) -> list[Tensor]:
    return [t for kv in kvs for t in kv]


def _pairs(flat: tuple[Tensor, ...]) -> list[KV]:
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


class EncoderStep(nn.Module):
    """BeamSearch's T5 encoder subgraph: encode, project cross K/V once, decode the start token."""

    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(self, encoder_input_ids: Tensor, encoder_attention_mask: Tensor, decoder_input_ids: Tensor):
        src_ids = encoder_input_ids.long()
        memory = self.model.encode(src_ids, encoder_attention_mask)  # [B, S, D]
        cross = self.model.decoder.project_memory(memory, src_ids)  # per layer [B, H, S, Dh] (+ pointer)
        logits, present = self.model.decoder(decoder_input_ids.long(), encoder_attention_mask, cross)
        if self.model.cfg.copy:  # ORT pairs every cross pair with a self pair: a one-position placeholder
            present.append((cross[-1][0][:, :, :1] * 0, cross[-1][0][:, :, :1] * 0))
        return logits, memory, *_flat(present), *_flat(cross)


class DecoderStep(nn.Module):
    """BeamSearch's T5 decoder subgraph: one new token on top of the self-attention cache."""

    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, *past: Tensor):
        n = 2 * _cache_layers(self.model)
        self_past, cross = _pairs(past[:n]), _pairs(past[n:])
        if self.model.cfg.copy:  # the pointer's placeholder self pair grows by one position, like the others
            placeholder = self_past.pop()
            grown = [torch.cat([t, t[:, :, :1] * 0], dim=2) for t in placeholder]
        logits, present = self.model.decoder(input_ids.long(), encoder_attention_mask, cross, self_past)
        if self.model.cfg.copy:
            present.append((grown[0], grown[1]))
        return logits, *_flat(present)


def _cache_layers(model: Seq2Seq) -> int:
    """The (self, cross) pairs ORT sees: one per decoder layer, plus the pointer's with cfg.copy."""
    return model.cfg.n_decoder_layers + int(model.cfg.copy)


def export_module(
    module: nn.Module, args: tuple, names_in: list, names_out: list, shapes, attention: str = "ort_fused"
) -> onnx.ModelProto:
    with quiet_exporter(), torch.no_grad(), using_attention(module, attention):
        program = torch.onnx.export(
            module.eval(),
            args,
            dynamo=True,
            opset_version=OPSET,
            input_names=names_in,
            output_names=names_out,
            dynamic_shapes=shapes,
            external_data=False,
        )
    proto = program.model_proto
    if proto.functions:
        raise RuntimeError("subgraphs cannot carry model-local functions; inline them first")
    return proto


def _example(model: Seq2Seq) -> tuple[Tensor, Tensor, tuple[torch.export.Dim, torch.export.Dim]]:
    cfg = model.cfg
    ids = torch.randint(4, cfg.vocab_size, (3, 7), dtype=torch.int32)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    batch = torch.export.Dim("batch", min=1, max=4096)
    sequence = torch.export.Dim("encode_sequence", min=1, max=cfg.max_len)
    return ids, mask, (batch, sequence)


def export_encoder_step(model: Seq2Seq) -> onnx.ModelProto:
    """The encoder subgraph as a standalone model (names and dtypes per the module docstring)."""
    cfg = model.cfg
    ids, mask, (batch, sequence) = _example(model)
    start = torch.full((ids.shape[0], 1), cfg.bos_id, dtype=torch.int32)
    n = _cache_layers(model)
    presents = _kv_names("present", "self", n) + _kv_names("present", "cross", n)
    names_out = ["logits", "encoder_hidden_states", *presents]
    shapes = {"encoder_input_ids": {0: batch, 1: sequence}, "encoder_attention_mask": {0: batch, 1: sequence}}
    shapes["decoder_input_ids"] = {0: batch}
    return export_module(EncoderStep(model), (ids, mask, start), list(shapes), names_out, shapes)


def export_decoder_step(model: Seq2Seq) -> onnx.ModelProto:
    """The decoder subgraph as a standalone model (names and dtypes per the module docstring)."""
    cfg = model.cfg
    _, mask, (batch, sequence) = _example(model)
    b, s, past_len = mask.shape[0], mask.shape[1], 4
    n = _cache_layers(model)
    tokens = torch.randint(4, cfg.target_vocab_size, (b, 1), dtype=torch.int32)
    self_past = [torch.randn(b, cfg.n_heads, past_len, cfg.head_dim) for _ in range(2 * n)]
    cross_past = [torch.randn(b, cfg.n_heads, s, cfg.head_dim) for _ in range(2 * n)]
    if cfg.copy:  # the pointer's value carries source ids
        cross_past[-1] = torch.randint(4, cfg.vocab_size, (b, 1, s, 1)).float().repeat(1, cfg.n_heads, 1, cfg.head_dim)
    past = torch.export.Dim("past_sequence", min=1, max=cfg.max_len)  # one Dim shared by keys and values
    shapes = (
        {0: batch},
        {0: batch, 1: sequence},
        tuple([{0: batch, 2: past}] * (2 * n) + [{0: batch, 2: sequence}] * (2 * n)),
    )
    pasts = _kv_names("past", "self", n) + _kv_names("past", "cross", n)
    names_in = ["input_ids", "encoder_attention_mask", *pasts]
    names_out = ["logits", *_kv_names("present", "self", n)]
    return export_module(DecoderStep(model), (tokens, mask, *self_past, *cross_past), names_in, names_out, shapes)


def _as_subgraph(proto: onnx.ModelProto, name: str) -> onnx.GraphProto:
    graph = onnx.GraphProto()
    graph.CopyFrom(proto.graph)
    graph.name = name
    return graph


def build_generator(
    model: Seq2Seq,
    *,
    max_len: int,
    length_penalty: float = 1.0,
    repetition_penalty: float = 1.0,
    early_stopping: bool = True,
    no_repeat_ngram_size: int = 0,
) -> onnx.ModelProto:
    """The generator ModelProto (see the module docstring for its I/O)."""
    cfg = model.cfg
    if not MIN_MAX_LENGTH <= max_len <= cfg.max_len:
        raise ValueError(f"max_len={max_len} must be in [{MIN_MAX_LENGTH}, cfg.max_len={cfg.max_len}]")
    encoder_proto = export_encoder_step(model)
    encoder = _as_subgraph(encoder_proto, "encoder")
    decoder = _as_subgraph(export_decoder_step(model), "decoder")
    constants = [
        numpy_helper.from_array(np.array([MIN_MAX_LENGTH], np.int32), "max_length_floor"),
        numpy_helper.from_array(np.array([max_len], np.int32), "max_length_ceiling"),
        numpy_helper.from_array(np.array([0], np.int32), "min_length"),
        numpy_helper.from_array(np.array([1], np.int32), "num_return_sequences"),
        numpy_helper.from_array(np.array([length_penalty], np.float32), "length_penalty"),
        numpy_helper.from_array(np.array([repetition_penalty], np.float32), "repetition_penalty"),
    ]
    clamp = helper.make_node(
        "Clip",
        ["max_length", "max_length_floor", "max_length_ceiling"],
        ["max_length_clamped"],
        name="clamp_max_length",
    )
    beam_search = helper.make_node(
        "BeamSearch",
        # input_ids, max_length, min_length, num_beams, num_return_sequences, length_penalty,
        # repetition_penalty, vocab_mask, prefix_vocab_mask, attention_mask. min_length is optional in
        # the schema, but ORT's kernel checks input 2 as if it were max_length: it must be given.
        [
            "input_ids",
            "max_length_clamped",
            "min_length",
            "num_beams",
            "num_return_sequences",
            "length_penalty",
            "repetition_penalty",
            "",
            "",
            "attention_mask",
        ],  # fmt: skip
        ["sequences"],
        name="beam_search",
        domain=MS_DOMAIN,
        model_type=1,
        eos_token_id=cfg.eos_id,
        pad_token_id=cfg.pad_id,
        decoder_start_token_id=cfg.bos_id,
        no_repeat_ngram_size=no_repeat_ngram_size,
        early_stopping=int(early_stopping),
        vocab_size=cfg.target_vocab_size,
        encoder=encoder,
        decoder=decoder,
    )
    graph = helper.make_graph(
        [clamp, beam_search],
        "seq2seq_generator",
        inputs=[
            helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT32, ["batch", "sequence"]),
            helper.make_tensor_value_info("max_length", TensorProto.INT32, [1]),
            helper.make_tensor_value_info("num_beams", TensorProto.INT32, [1]),
        ],
        outputs=[helper.make_tensor_value_info("sequences", TensorProto.INT32, ["batch", 1, "max_length"])],
        initializer=constants,
    )
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
    generator = helper.make_model(graph, opset_imports=opsets, producer_name="ropeserve")
    generator.ir_version = encoder_proto.ir_version  # 10: ONNX 1.16, which ORT 1.19 reads
    settings = {"bos_id": cfg.bos_id, "eos_id": cfg.eos_id, "pad_id": cfg.pad_id, "max_len": max_len}
    settings |= {"length_penalty": length_penalty, "early_stopping": int(early_stopping)}
    settings |= {"no_repeat_ngram_size": no_repeat_ngram_size}
    helper.set_model_props(generator, {k: str(v) for k, v in settings.items()})  # readable by the front model
    return generator


def export_generator(
    model: Seq2Seq,
    out_path: Path,
    *,
    max_len: int,
    length_penalty: float = 1.0,
    repetition_penalty: float = 1.0,
    early_stopping: bool = True,
    no_repeat_ngram_size: int = 0,
) -> Path:
    """Write the one-graph generator (BeamSearch over encoder/decoder subgraphs) to out_path.

    max_len caps max_length (bos + generated tokens); it must not exceed model.cfg.max_len.
    """
    proto = build_generator(
        model,
        max_len=max_len,
        length_penalty=length_penalty,
        repetition_penalty=repetition_penalty,
        early_stopping=early_stopping,
        no_repeat_ngram_size=no_repeat_ngram_size,
    )
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, str(out_path))
    onnx.checker.check_model(str(out_path))
    return out_path


def subgraph_model(generator: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """The "encoder" or "decoder" subgraph of a generator as a standalone model (tests, profiling)."""
    node = next(n for n in generator.graph.node if n.op_type == "BeamSearch")
    graph = next(helper.get_attribute_value(a) for a in node.attribute if a.name == name)
    model = helper.make_model(graph, opset_imports=generator.opset_import)
    model.ir_version = generator.ir_version
    return model


def generate_onnx(session, ids, mask, max_new_tokens: int, num_beams: int, cfg=None) -> list[list[int]]:
    """Run a generator session: ids/mask [B, S] (any int dtype) → B token lists (no bos/eos/pad).

    max_length is max_new_tokens + 1 (the start token counts); the graph clamps it to >= 3, so
    very short requests are cut here. cfg supplies the special ids (default: 2/3/0).
    """
    bos, eos, pad = (cfg.bos_id, cfg.eos_id, cfg.pad_id) if cfg is not None else (2, 3, 0)
    feeds = {
        "input_ids": np.asarray(ids, dtype=np.int32),
        "attention_mask": np.asarray(mask, dtype=np.int32),
        "max_length": np.array([max_new_tokens + 1], np.int32),
        "num_beams": np.array([num_beams], np.int32),
    }
    sequences = session.run(["sequences"], feeds)[0]  # [B, 1, L]
    return [strip_generated(row[0], bos, eos, pad)[:max_new_tokens] for row in sequences]
