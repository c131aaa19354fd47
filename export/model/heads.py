"""The pointer-generator's copy head: summaries copy phrases from their text."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from export.model.attention import KV, MASK_FILTER_VALUE, group_by_source, split_heads
from export.model.config import ModelConfig


class CopyPointer(nn.Module):
    """Pointer-generator output (See et al. 2017, "Get To The Point"): p = g · P_vocab + (1 − g) · P_copy.

    P_copy puts each source position's pointer-attention weight (mean over heads) on that position's
    token id; the gate g = σ(w · h) decides per step between generating and copying. The result is
    returned as log p, so that log_softmax (the loss, the beam search) leaves it unchanged.

    The pointer needs the source ids at every decoding step. They travel in the cross-attention
    cache as one extra (key, value) pair: key = the pointer keys [B, H, S, Dh], value = the source
    ids as floats broadcast to [B, H, S, Dh]: the shape ORT's BeamSearch expects of every cross
    pair, so it expands and carries them per beam like the others (exact: ids < 2**24).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.query = nn.Linear(cfg.d_model, cfg.d_model)
        self.key = nn.Linear(cfg.d_model, cfg.d_model)
        self.gate = nn.Linear(cfg.d_model, 1)

    def project_memory(self, memory: Tensor, src_ids: Tensor) -> KV:
        keys = split_heads(self.key(memory), self.n_heads)  # [B, H, S, Dh]
        return keys, src_ids.to(keys.dtype)[:, None, :, None].expand_as(keys)

    def forward(self, h: Tensor, logits: Tensor, pointer_kv: KV, src_mask: Tensor) -> Tensor:
        """h [R, T, D] (normed decoder state), logits [R, T, V] → log p [R, T, V] (float32); pointer_kv
        [B, H, S, Dh] with R = B · rows per source, as in cross-attention.

        The pointer weights are scores softmaxed in float32 and averaged over heads, with no values to
        mix: a distribution over source positions rather than an attention output.
        """
        keys, ids = pointer_kv
        shape, sources = logits.shape, keys.shape[0]
        h, logits = group_by_source(h, sources), group_by_source(logits, sources)  # T: rows per source · T
        q = split_heads(self.query(h), self.n_heads)  # [B, H, T, Dh]
        scores = (q @ keys.transpose(-1, -2)).float() / math.sqrt(q.shape[-1])  # [B, H, T, S]
        padded = (src_mask == 0)[:, None, None, :]
        attention = scores.masked_fill(padded, MASK_FILTER_VALUE).softmax(-1).mean(1)  # [B, T, S]
        source = ids[:, 0, :, 0].long()[:, None, :].expand_as(attention)  # [B, T, S]
        copied = torch.zeros_like(logits, dtype=torch.float32).scatter_add(-1, source, attention)
        g = torch.sigmoid(self.gate(h).float())  # [B, T, 1]
        return torch.log(g * logits.float().softmax(-1) + (1 - g) * copied + 1e-9).reshape(shape)
