"""Task heads beyond the core model: BERT's masked-LM pre-training head and the pointer-generator's copy head."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from export.attention import KV, MASK_FILTER_VALUE, group_by_source, split_heads

if TYPE_CHECKING:
    from export.model import Encoder, ModelConfig


class MaskedLanguageModel(nn.Module):
    """Pre-training head for an encoder: predict masked tokens from both sides (BERT's objective).

    Shares the encoder object (and ties the output projection to its token embedding), so after
    pre-training the same encoder goes into the classifier.
    """

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder
        self.bias = nn.Parameter(torch.zeros(encoder.cfg.vocab_size))

    def forward(self, input_ids: Tensor, attention_mask: Tensor, targets: Tensor) -> Tensor:
        """The masked-token loss. Only the target positions (not -100 in `targets` [B, S]) are projected onto
        the vocabulary: about 15% of them, where projecting every position made the [B, S, V] logits most of a
        pre-training step's cost."""
        h = self.encoder(input_ids, attention_mask)  # [B, S, D]
        chosen = targets != -100
        if not chosen.any():  # a batch of few tokens may draw none: no loss rather than the mean of nothing
            return h.sum() * 0.0
        logits = h[chosen] @ self.encoder.embed.weight.T + self.bias  # [N, V]
        return F.cross_entropy(logits.float(), targets[chosen])


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
