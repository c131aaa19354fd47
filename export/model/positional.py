"""Positions: rotary embeddings (RoPE, every served model) and the other schemes of the seed's comparison.

`ModelConfig.positional` picks one (measured in ABLATION.md): "rope" rotates Q and K by the position angle,
so q·k depends on i - j only; "sinusoidal" and "learned" add a table row per position to the token
embeddings; "relative_bias" adds a learned a_{i-j} to the attention scores. The encoder-decoder and the
served models use RoPE; the others are encoder-only.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from export.model.attention import ort_op
from export.model.config import ModelConfig


def rope_tables(max_len: int, head_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos/sin tables [max_len, head_dim/2]: angle(pos, i) = pos / base^(2i/head_dim).

    They are precomputed buffers, so the exported graph has no angle MatMul that int8
    quantization could ruin at long positions.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(
    x: Tensor, cos: Tensor, sin: Tensor, offset: int | Tensor = 0, fused: bool = False, starts: Tensor | None = None
) -> Tensor:
    """Rotate each head's (x1, x2) half-pairs by the position angle.

    x: [B, S, H*Dh] (heads concatenated); cos/sin: [max_len, Dh/2]; positions start at `offset`, or per row
    at `starts` [B] (rows of one batch at different positions: the continuous-batching decoder step).
    The half-split ("rotate half", non-interleaved) layout is what ORT's RotaryEmbedding
    computes with interleaved=0; `fused` emits that node (the "ort_fused" attention).
    """
    b, s, d = x.shape
    if fused:
        if starts is not None:  # position_ids [B, S]
            position = starts.to(torch.int64)[:, None] + torch.arange(s, dtype=torch.int64)
        elif isinstance(offset, Tensor):
            position = offset.reshape(1).to(torch.int64)
        else:  # torch.full keeps a symbolic offset (the KV-cache length) dynamic; as_tensor would freeze it.
            position = torch.full((1,), offset, dtype=torch.int64)
        return ort_op("RotaryEmbedding", (x, position, cos, sin), {"interleaved": 0}, x.dtype, x.shape)
    half = cos.shape[-1]
    xh = x.view(b, s, d // (2 * half), 2 * half)  # [B, S, H, Dh]
    if starts is not None:
        index = starts.long()[:, None] + torch.arange(s)  # [B, S]
        c, n = cos[index].view(b, s, 1, half), sin[index].view(b, s, 1, half)
    else:
        c = cos[offset : offset + s].view(1, s, 1, half)
        n = sin[offset : offset + s].view(1, s, 1, half)
    x1, x2 = xh[..., :half], xh[..., half:]
    return torch.cat([x1 * c - x2 * n, x2 * c + x1 * n], dim=-1).view(b, s, d)


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """The original Transformer's table [max_len, d_model], added to the token embeddings:

        PE(pos, 2i)   = sin(pos / 10000^(2i/d_model))
        PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))

    The angles are RoPE's with head_dim = d_model; PE(pos + k) is a linear map of PE(pos).
    """
    cos, sin = rope_tables(max_len, d_model)
    return torch.stack([sin, cos], dim=-1).flatten(1)  # interleave: sin at even, cos at odd dimensions


def relative_bucket(distance: Tensor, n_buckets: int, max_distance: int) -> Tensor:
    """T5's bucket of each relative distance i - j (int64, any shape).

    Half the buckets per direction; in each, distances below n_buckets/4 get a bucket of their own
    and longer ones share log-spaced buckets, the last one holding every distance >= max_distance.
    """
    half = n_buckets // 2
    exact = half // 2
    d = distance.abs()
    log_spaced = exact + (torch.log(d.clamp(min=1).float() / exact) / math.log(max_distance / exact) * (half - exact))
    log_spaced = log_spaced.long().clamp(max=half - 1)
    return (distance > 0).long() * half + torch.where(d < exact, d, log_spaced)


class RelativePositionBias(nn.Module):
    """e_ij = (x_i W_Q)(x_j W_K)ᵀ/√d + a_{i-j}: one learned scalar per head and bucket of i - j.

    Shared by all layers (as in T5). Starts at zero, so a bucket that training never reached
    (a distance longer than any training sequence) adds nothing instead of noise.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_buckets, self.max_distance = cfg.relative_buckets, cfg.relative_max_distance
        self.bias = nn.Parameter(torch.zeros(cfg.relative_buckets, cfg.n_heads))  # a[bucket, head]

    def forward(self, seq_len: int) -> Tensor:
        """Additive score bias [1, H, S, S] for S positions."""
        pos = torch.arange(seq_len, device=self.bias.device)
        buckets = relative_bucket(pos[:, None] - pos[None, :], self.n_buckets, self.max_distance)  # [S, S]: i - j
        return self.bias[buckets].permute(2, 0, 1).unsqueeze(0)
