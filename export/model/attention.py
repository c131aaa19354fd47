"""Attention, written once: softmax(Q·Kᵀ/√d_k + bias + mask)·V over heads, in three implementations.

``"sdpa"``
    `F.scaled_dot_product_attention`: eager PyTorch (training, the reference generation loops). Exported,
    it decomposes into plain ONNX ops (MatMul, Softmax, …): the benchmarks' baseline.
``"ort_fused"``
    One `com.microsoft::MultiHeadAttention` node per attention (and `com.microsoft::RotaryEmbedding` for
    RoPE): what the served ONNX models hold. These nodes only exist in an exported graph.
``"explicit"``
    The formula written out, keeping the probabilities: what the explain models return.

The attention modules carry their implementation (`attn_implementation`, "sdpa" when built);
`set_attention` switches a whole model, `using_attention` for the duration of an export. A forward given an
`AttentionRecord` computes its attention explicitly and records the probabilities, whatever the modules
are set to, so an explain model exported with "ort_fused" keeps the fused RoPE.

Keys and values are in the BNSH layout [B, H, T, Dh] once split into heads: the layout of
MultiHeadAttention's past/present tensors and of ONNX Runtime's BeamSearch op.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

IMPLEMENTATIONS = ("sdpa", "ort_fused", "explicit")
MS_DOMAIN_VERSION = 1
MASK_FILTER_VALUE = -10000.0  # ORT's default for masked scores; finite, so fp16-safe

KV = tuple[Tensor, Tensor]  # (key, value), each [B, H, T, Dh]


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """[B, S, H*Dh] → [B, H, S, Dh] (BNSH, the KV-cache layout)."""
    b, s, d = x.shape
    return x.view(b, s, n_heads, d // n_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """[B, H, S, Dh] → [B, S, H*Dh]."""
    b, h, s, dh = x.shape
    return x.transpose(1, 2).reshape(b, s, h * dh)


def group_by_source(x: Tensor, sources: int) -> Tensor:
    """[R, T, D] → [sources, R/sources · T, D]: the queries of a source's consecutive rows (its beams) as one
    sequence, so that they attend over its memory stored once [sources, H, S, Dh] instead of once per row.
    Exact for attention with no causal mask (each query is independent): the cross-attention and the copy
    pointer. With one row per source it changes nothing."""
    return x.reshape(sources, -1, x.shape[-1])


class Attended(NamedTuple):
    out: Tensor  # [B, S, H*Dh]
    present: KV | None  # the keys/values attended to, past included [B, H, P+T, Dh]
    probs: Tensor | None  # [B, H, S, P+T], "explicit" only


@dataclass
class AttentionRecord:
    """Attention probabilities [B, H, queries, keys] in call order (= layer order within a stack)."""

    encoder: list[Tensor] = field(default_factory=list)  # self-attention of encoders
    decoder: list[Tensor] = field(default_factory=list)  # causal self-attention of the decoder
    cross: list[Tensor] = field(default_factory=list)  # decoder → encoder memory


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    impl: str,
    n_heads: int,
    *,
    key_padding_mask: Tensor | None = None,
    causal: bool = False,
    past: KV | None = None,
    bias: Tensor | None = None,
    dropout: float = 0.0,
    cache_lengths: Tensor | None = None,
) -> Attended:
    """Multi-head attention of queries q [B, S, H*Dh] over keys and values.

    k, v: [B, T, H*Dh], or [B, H, T, Dh] when projected once ahead (the cross-attention memory);
    key_padding_mask: [B, T], 1 = token, 0 = padding (never attended); bias: additive scores [1, H, S, T]
    (relative positions). causal: query i sits at position P+i and sees keys 0..P+i, where P is the length
    of `past` (cached keys/values [B, H, P, Dh]).

    With `cache_lengths` [B] (one new position per row, S = T = 1), `past` is instead a buffer [B, H, C, Dh]
    whose row b holds its cache_lengths[b] keys at the start: the new key goes in at column cache_lengths[b]
    and the row attends over columns 0..cache_lengths[b]. The present is the buffer so written. Fused, this is
    `com.microsoft::GroupQueryAttention`, which writes in place when the present is bound to the past's memory:
    no copy of the cache per step (the continuous-batching decoder step, export/graphs/step_export.py).
    """
    if impl == "ort_fused":
        if cache_lengths is not None:
            return _group_query_attention(q, k, v, n_heads, past, cache_lengths)
        return _multi_head_attention(q, k, v, n_heads, key_padding_mask, causal, past, bias)
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {impl!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    kh, vh = (k, v) if k.dim() == 4 else (split_heads(k, n_heads), split_heads(v, n_heads))
    if cache_lengths is not None:
        kh, vh, key_padding_mask = _written_into(past, kh, vh, cache_lengths)
        past, causal = None, False  # one new position: the buffer's mask is the causal mask
    if past is not None:
        kh, vh = torch.cat([past[0], kh], dim=2), torch.cat([past[1], vh], dim=2)  # [B, H, P+T, Dh]
    allowed = None if key_padding_mask is None else key_padding_mask.bool()[:, None, None, :]  # [B, 1, 1, T]
    t = q.shape[1]
    if causal and (impl == "explicit" or t > 1):  # for SDPA one new position sees everything cached: no mask
        p = kh.shape[2] - t
        future = torch.ones(t, p + t, dtype=torch.bool, device=q.device).tril(diagonal=p)  # [T, P+T]
        allowed = future if allowed is None else allowed & future
    qh = split_heads(q, n_heads)  # [B, H, S, Dh]
    if impl == "sdpa" and bias is None:  # with a float mask SDPA does not export: biased scores are written out
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed, dropout_p=dropout)
        return Attended(merge_heads(out), (kh, vh), None)
    scores = qh @ kh.transpose(-1, -2) * (1.0 / math.sqrt(qh.shape[-1]))  # [B, H, S, P+T]
    if bias is not None:
        scores = scores + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))  # padded keys and the future get 0
    probs = scores.softmax(dim=-1)
    out = (F.dropout(probs, dropout) if dropout else probs) @ vh
    return Attended(merge_heads(out), (kh, vh), probs if impl == "explicit" else None)


def _written_into(buffer: KV, k: Tensor, v: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The cache buffer [B, H, C, Dh] with each row's new key and value [B, H, 1, Dh] at column lengths[b],
    and the mask [B, C] of the columns each row attends to (0..lengths[b])."""
    if k.shape[2] != 1:
        raise ValueError(f"a cache buffer takes one new position per row, got {k.shape[2]}")
    rows = torch.arange(k.shape[0])
    keys, values = buffer[0].clone(), buffer[1].clone()
    keys[rows, :, lengths.long()] = k[:, :, 0]
    values[rows, :, lengths.long()] = v[:, :, 0]
    mask = torch.arange(keys.shape[2])[None, :] <= lengths.long()[:, None]
    return keys, values, mask


def _group_query_attention(q: Tensor, k: Tensor, v: Tensor, n_heads: int, buffer: KV, lengths: Tensor) -> Attended:
    """One `com.microsoft::GroupQueryAttention` node (as many key/value heads as query heads): inputs query, key,
    value [B, 1, H*Dh], past_key, past_value [B, H, C, Dh], seqlens_k [B] (the cached keys per row) and
    total_sequence_length (the longest row's, new key included); outputs the attention and the buffers."""
    seqlens = lengths.to(torch.int32)
    total = (lengths.max() + 1).to(torch.int32)
    inputs = (q, k, v, buffer[0], buffer[1], seqlens, total)
    attrs = {"num_heads": n_heads, "kv_num_heads": n_heads}
    shape = buffer[0].shape
    out, present_k, present_v = ort_op("GroupQueryAttention", inputs, attrs, q.dtype, q.shape, shape, shape)
    return Attended(out, (present_k, present_v), None)


def _multi_head_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    n_heads: int,
    key_padding_mask: Tensor | None,
    causal: bool,
    past: KV | None,
    bias: Tensor | None,
) -> Attended:
    """One `com.microsoft::MultiHeadAttention` node. Its inputs: query, key, value, bias (of the
    projections, unused), key_padding_mask, attention_bias, past_key, past_value."""
    if causal:  # the decoder's self-attention: past_key/past_value in, present key/value out
        b, t, d = q.shape
        past_len = 0 if past is None else past[0].shape[2]
        present_shape = (b, n_heads, past_len + t, d // n_heads)
        # Rows with padded caches (continuous batching) mask their padding with an additive bias, for the
        # reason cross-attention does (below); [B, H, T, P+T].
        masked = None
        if key_padding_mask is not None:
            padded = (key_padding_mask == 0).to(q.dtype)[:, None, None, :]
            masked = (padded * MASK_FILTER_VALUE).expand(b, n_heads, t, key_padding_mask.shape[1])
        inputs = (q, k, v) if past is None else (q, k, v, None, None, masked, past[0], past[1])
        # One new position (BeamSearch's decoding step) needs no mask; leaving `unidirectional` off
        # then keeps the node runnable by kernels that lack it (e.g. ORT's WebGPU MHA).
        one_step = isinstance(t, int) and t == 1
        attrs = {"num_heads": n_heads} if one_step else {"num_heads": n_heads, "unidirectional": 1}
        out, present_k, present_v = ort_op(
            "MultiHeadAttention", inputs, attrs, q.dtype, q.shape, present_shape, present_shape
        )
        return Attended(out, (present_k, present_v), None)
    if k.dim() == 4:
        # Keys projected once from the encoder memory (cross-attention). ORT 1.19's CPU kernel ignores
        # key_padding_mask when the query and key lengths differ (measured), so padding becomes an
        # additive attention_bias, with all four dims [B, H, T, S] (1.19 does not broadcast it).
        b, t, _ = q.shape
        padded = (key_padding_mask == 0).to(q.dtype)[:, None, None, :]  # [B, 1, 1, S]
        inputs = (q, k, v, None, None, (padded * MASK_FILTER_VALUE).expand(b, n_heads, t, k.shape[2]))
    else:
        inputs = (q, k, v, None, key_padding_mask.to(torch.int32))
        if bias is not None:
            inputs = (*inputs, bias)  # attention_bias [1, H, S, T]
    return Attended(ort_op("MultiHeadAttention", inputs, {"num_heads": n_heads}, q.dtype, q.shape), None, None)


def ort_op(name: str, inputs: tuple, attrs: dict, dtype: torch.dtype, *shapes) -> Tensor | tuple[Tensor, ...]:
    """A node of ONNX Runtime's contrib domain `com.microsoft` in the exported graph, one output per shape.

    Outside an export the exporter's placeholder would return zeros, so it is refused.
    """
    if not torch.onnx.is_in_onnx_export():
        raise RuntimeError(
            f"com.microsoft::{name} exists only in an exported ONNX graph; run PyTorch with 'sdpa' or 'explicit'"
        )
    if len(shapes) == 1:
        op = torch.onnx.ops.symbolic
        return op(f"com.microsoft::{name}", inputs, attrs, dtype=dtype, shape=shapes[0], version=MS_DOMAIN_VERSION)
    return torch.onnx.ops.symbolic_multi_out(
        f"com.microsoft::{name}",
        inputs,
        attrs,
        dtypes=(dtype,) * len(shapes),
        shapes=shapes,
        version=MS_DOMAIN_VERSION,
    )


class AttentionLayer(nn.Module):
    """Base of the attention modules: the implementation they compute with, and their dropout."""

    def __init__(self, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.attn_implementation = "sdpa"

    def attend(self, q: Tensor, k: Tensor, v: Tensor, record: list[Tensor] | None = None, **kwargs) -> Attended:
        """`attention` with this layer's implementation; given a record, explicit, probabilities appended."""
        impl = self.attn_implementation if record is None else "explicit"
        result = attention(q, k, v, impl, self.n_heads, dropout=self.dropout if self.training else 0.0, **kwargs)
        if record is not None:
            record.append(result.probs)
        return result


def set_attention(model: nn.Module, impl: str) -> nn.Module:
    """Compute every attention of `model` with `impl` (one of IMPLEMENTATIONS) from now on; returns `model`."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {impl!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    for module in model.modules():
        if isinstance(module, AttentionLayer):
            module.attn_implementation = impl
    return model


@contextlib.contextmanager
def using_attention(model: nn.Module, impl: str) -> Iterator[nn.Module]:
    """`set_attention` inside the block (an export), each layer's own implementation restored after it."""
    saved = [(m, m.attn_implementation) for m in model.modules() if isinstance(m, AttentionLayer)]
    try:
        yield set_attention(model, impl)
    finally:
        for module, impl_before in saved:
            module.attn_implementation = impl_before


@dataclass
class KVCache:
    """Decoding state of one batch: per layer self-attention (key, value) that grows by one position
    per step, and cross-attention (key, value) projected once from the encoder memory."""

    self_kv: list[KV] | None = None  # each [B, H, T_decoded, Dh]
    cross_kv: list[KV] | None = None  # each [B, H, S, Dh]

    @property
    def length(self) -> int:
        return 0 if self.self_kv is None else self.self_kv[0][0].shape[2]

    def reorder(self, rows: Tensor, cross: bool = True) -> None:
        """Keep batch rows `rows` [B'] (in that order): beam search follows the surviving beams.

        cross=False reorders only the self-attention cache, as ORT's BeamSearch does (the cross
        keys/values of the beams of one source are identical).
        """

        def pick(layers: list[KV] | None) -> list[KV] | None:
            return None if layers is None else [(k[rows], v[rows]) for k, v in layers]

        self.self_kv = pick(self.self_kv)
        if cross:
            self.cross_kv = pick(self.cross_kv)
