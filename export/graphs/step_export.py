"""Seq2Seq → two ONNX graphs for iteration-level (continuous) batching: an encoder and a one-token decoder step,
as the generation contract (tasks/generation_contract.py) names them.

The BeamSearch generator (export/graphs/seq2seq_export.py) runs a whole batch from the first token to the last: every
row has the same position and nothing joins on the way. These graphs let the serving engine (serving/engine/)
drive the loop itself: rows join the running batch at any step and leave it the step they finish, so each row of
the decoder step sits at its own position with its own cache length. Every attention is one fused
`com.microsoft::MultiHeadAttention` node and RoPE the fused `RotaryEmbedding`, as in the generator.

encoder
    inputs   input_ids int32 [B, S], attention_mask int32 [B, S] (1 = token)
    outputs  cross_{key,value}_i float32 [B, H, S, Dh] per decoder layer (and the copy pointer's pair last,
             with cfg.copy: keys, and the source ids as floats), projected once per source
decoder step
    inputs   input_ids int32 [B, 1] (each row's newest token, bos first), positions int64 [B] (its position:
             the keys it has cached), past_{key,value}_self_i float32 [B, H, C, Dh] (row b's cache in
             columns 0..positions[b]-1 of a buffer of C > max(positions) columns), cross_mask int32 [N, S],
             cross_{key,value}_i [N, H, S, Dh]: once per source, with B = N · rows per source (a source's rows
             consecutive, export/model/attention.py: group_by_source), or once per row (N = B)
    outputs  log_probs float32 [B, V] (log-softmax of the next-token logits; log p with the copy pointer),
             top_log_probs float32 / top_ids int64 [B, TOP_K]: each row's best, best first (the engine then
             reads only these),
             present_{key,value}_self_i [B, H, C, Dh]: the buffer with each row's new key at column positions[b]

The self-attention is `com.microsoft::GroupQueryAttention` (with as many key/value heads as query heads): bound
to the same memory as the past (ORT's I/O binding), the present is written in place, one column per row and
step, where MultiHeadAttention would copy the whole cache into a new present every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx
import torch
from torch import Tensor, nn

from export.graphs.seq2seq_export import _example, _flat, _pairs, export_module
from export.model.transformer import Seq2Seq
from tasks import generation_contract as contract


class StepEncoder(nn.Module):
    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        ids = input_ids.long()
        memory = self.model.encode(ids, attention_mask)
        return tuple(_flat(self.model.decoder.project_memory(memory, ids)))


class StepDecoder(nn.Module):
    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, positions: Tensor, cross_mask: Tensor, *caches: Tensor):
        n = 2 * self.model.cfg.n_decoder_layers
        past, cross = _pairs(caches[:n]), _pairs(caches[n:])
        logits, present = self.model.decoder(input_ids.long(), cross_mask, cross, past, starts=positions)
        log_probs = logits[:, -1].float().log_softmax(-1)
        top_log_probs, top_ids = log_probs.topk(contract.TOP_K, dim=-1)
        return log_probs, top_log_probs, top_ids, *_flat(present)


def cross_layers(model: Seq2Seq) -> int:
    """Cross-attention (key, value) pairs: one per decoder layer, plus the copy pointer's."""
    return model.cfg.n_decoder_layers + int(model.cfg.copy)


def export_encoder(model: Seq2Seq) -> onnx.ModelProto:
    ids, mask, (batch, sequence) = _example(model)
    shapes = {name: {0: batch, 1: sequence} for name in contract.encoder_inputs()}
    outputs = contract.cross_names(cross_layers(model))
    return export_module(StepEncoder(model), (ids, mask), list(shapes), outputs, shapes)


def source_example(
    low: int, high: int, max_len: int
) -> tuple[tuple[Tensor, Tensor], dict[str, dict[int, torch.export.Dim]]]:
    """A source graph's example inputs (ids in [low, high), a padded second row) and their dynamic dims, by the
    contract's input names: what an encoder graph is exported with."""
    ids = torch.randint(low, high, (3, 7), dtype=torch.int32)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    batch = torch.export.Dim("batch", min=1, max=4096)
    sequence = torch.export.Dim("sequence", min=1, max=max_len)
    return (ids, mask), {name: {0: batch, 1: sequence} for name in contract.encoder_inputs()}


def decoder_example(
    n_layers: int, n_cross: int, heads: int, head_dim: int, vocab: int, max_len: int
) -> tuple[list[Tensor], tuple]:
    """A decoder step's example inputs in the contract's order, and their dynamic dims, for `export_module`."""
    b, s, p = 6, 7, 8  # 6 rows: 3 sources of 2 beams, so that the graph keeps rows and sources apart
    tokens = torch.randint(4, vocab, (b, 1), dtype=torch.int32)
    positions = torch.tensor([4, 4, 0, 0, 2, 2])
    cross_mask = torch.ones(b // 2, s, dtype=torch.int32)
    cross_mask[1, 4:] = 0
    past = [torch.randn(b, heads, p, head_dim) for _ in range(2 * n_layers)]
    cross = [torch.randn(b // 2, heads, s, head_dim) for _ in range(2 * n_cross)]
    batch = torch.export.Dim("batch", min=1, max=4096)
    sources = torch.export.Dim("sources", min=1, max=4096)
    source = torch.export.Dim("source", min=1, max=max_len)
    capacity = torch.export.Dim("capacity", min=2, max=max_len)
    shapes = (
        {0: batch},
        {0: batch},
        {0: sources, 1: source},
        tuple([{0: batch, 2: capacity}] * (2 * n_layers) + [{0: sources, 2: source}] * (2 * n_cross)),
    )
    return [tokens, positions, cross_mask, *past, *cross], shapes


def export_decoder(model: Seq2Seq) -> onnx.ModelProto:
    cfg = model.cfg
    n, c = cfg.n_decoder_layers, cross_layers(model)
    args, shapes = decoder_example(n, c, cfg.n_heads, cfg.head_dim, cfg.target_vocab_size, cfg.max_len)
    if cfg.copy:  # the pointer's value carries source ids
        sources, _, source, _ = args[-1].shape
        ids = torch.randint(4, cfg.vocab_size, (sources, 1, source, 1)).float()
        args[-1] = ids.repeat(1, cfg.n_heads, 1, cfg.head_dim)
    names_in, names_out = contract.decoder_inputs(n, c), contract.decoder_outputs(n)
    return export_module(StepDecoder(model), tuple(args), names_in, names_out, shapes)


def export_step_graphs(model: Seq2Seq, folder: Path) -> tuple[Path, Path]:
    """Write encoder.onnx and decoder.onnx into `folder` (checked by onnx.checker)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = tuple(folder / name for name in contract.graph_files("fp32"))
    for proto, path in zip((export_encoder(model), export_decoder(model)), paths):
        onnx.save(proto, str(path))
        onnx.checker.check_model(str(path))
    return paths


# -- int8 variant ------------------------------------------------------------------------------------------------

ROPE_TABLE_MARK = "rope_"  # initializer names of the precomputed cos/sin tables (encoder.rope_cos/rope_sin)


def rope_path_nodes(model: onnx.ModelProto) -> list[str]:
    """Nodes on the RoPE path: those reading the cos/sin tables, and every node computing their other inputs
    (positions). Quantizing any of them would round the rotation angles, which ruins long positions."""
    producers = {out: node for node in model.graph.node for out in node.output}
    tables = {init.name for init in model.graph.initializer if ROPE_TABLE_MARK in init.name}
    readers = [node for node in model.graph.node if tables.intersection(node.input)]
    names: set[str] = set()
    stack = [name for node in readers for name in node.input[1:] if name not in tables]
    names.update(node.name for node in readers)
    while stack:
        node = producers.get(stack.pop())
        if node is None or node.name in names:
            continue
        names.add(node.name)
        stack.extend(node.input)
    return sorted(names)


def quantize_graph(src: Path, dst: Path, keep_fp32: Sequence[str] = (), per_channel: bool = False) -> list[str]:
    """Dynamic int8 quantization of the MatMul weights of `src` into `dst`: the RoPE path and the nodes named in
    `keep_fp32` stay float. Returns the excluded node names. The fused attention and rotary nodes are not
    MatMuls, so they stay as they are; their projections (plain MatMuls) are quantized."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    proto = onnx.load(str(src))
    excluded = sorted({*rope_path_nodes(proto), *keep_fp32})
    # The exporter's value_info records shapes from its example batch; ONNX shape inference inside the
    # quantizer then contradicts them ("existing shape differs"). Shapes are re-inferred, so drop them.
    del proto.graph.value_info[:]
    quantize_dynamic(
        proto,
        str(dst),
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
        per_channel=per_channel,
        nodes_to_exclude=excluded,
        extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    onnx.checker.check_model(str(dst))
    return excluded


def quantize_step_graphs(folder: Path) -> tuple[Path, Path]:
    """Write encoder.int8.onnx and decoder.int8.onnx next to the float graphs in `folder`: MatMul weights int8
    (dynamic quantization of the activations), RoPE path float. The front model serves them with the Triton
    parameter precision = "int8" (serving/frontends/engine_front.py)."""
    folder = Path(folder)
    sources = [folder / name for name in contract.graph_files("fp32")]
    paths = tuple(folder / name for name in contract.graph_files("int8"))
    for src, dst in zip(sources, paths):
        quantize_graph(src, dst)
    return paths
