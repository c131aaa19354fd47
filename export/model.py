"""The Transformer, in one readable file.

Token embeddings → pre-norm blocks of multi-head self-attention with rotary position
embeddings (RoPE) and a feed-forward network → a task head. This follows the seed
documents step by step:

    Q = x @ W_Q, K = x @ W_K, V = x @ W_V          (one fused projection here)
    Q, K = rotate(Q, pos), rotate(K, pos)           (RoPE: q·k depends on i - j only)
    out = softmax(Q @ K.T / sqrt(d_k)) @ V          (F.scaled_dot_product_attention)
    MultiHead = Concat(head_1..head_h) @ W_O

Eager PyTorch runs plain `F.scaled_dot_product_attention`. While exporting to ONNX the same
forward emits ONNX Runtime's fused operators instead (`com.microsoft::RotaryEmbedding` and
`com.microsoft::MultiHeadAttention`), so the exported graph holds one fused attention node per
layer by construction; no pattern matching by an optimizer is needed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MS_DOMAIN_VERSION = 1


@dataclass
class ModelConfig:
    vocab_size: int = 8000
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 1024
    max_len: int = 512  # longest sequence the RoPE tables cover; inputs are truncated to it
    dropout: float = 0.1
    rope_base: float = 10000.0
    pad_id: int = 0
    num_labels: int = 2

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")


# ---------------------------------------------------------------------------------------------
# Rotary position embedding
# ---------------------------------------------------------------------------------------------


def rope_tables(max_len: int, head_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos/sin tables [max_len, head_dim/2]: angle(pos, i) = pos / base^(2i/head_dim).

    They are precomputed buffers, so the exported graph has no angle MatMul that int8
    quantization could ruin at long positions.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, offset: int | Tensor = 0) -> Tensor:
    """Rotate each head's (x1, x2) half-pairs by the position angle.

    x: [B, S, H*Dh] (heads concatenated); cos/sin: [max_len, Dh/2].
    The half-split ("rotate half", non-interleaved) layout is what ORT's RotaryEmbedding
    computes with interleaved=0.
    """
    if torch.onnx.is_in_onnx_export():
        position = torch.as_tensor(offset, dtype=torch.int64).reshape(1)
        return torch.onnx.ops.symbolic(
            "com.microsoft::RotaryEmbedding",
            (x, position, cos, sin),
            {"interleaved": 0},
            dtype=x.dtype,
            shape=x.shape,
            version=MS_DOMAIN_VERSION,
        )
    b, s, d = x.shape
    half = cos.shape[-1]
    xh = x.view(b, s, d // (2 * half), 2 * half)  # [B, S, H, Dh]
    c = cos[offset : offset + s].view(1, s, 1, half)
    n = sin[offset : offset + s].view(1, s, 1, half)
    x1, x2 = xh[..., :half], xh[..., half:]
    return torch.cat([x1 * c - x2 * n, x2 * c + x1 * n], dim=-1).view(b, s, d)


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------


def fused_attention(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor, n_heads: int, dropout: float) -> Tensor:
    """softmax(Q·Kᵀ/√d)·V over heads, ignoring padded keys.

    q: [B, S, D]; k, v: [B, T, D]; key_padding_mask: [B, T] (1 = real token, 0 = padding).
    Returns [B, S, D]. In export this is one `com.microsoft::MultiHeadAttention` node.
    """
    if torch.onnx.is_in_onnx_export():
        return torch.onnx.ops.symbolic(
            "com.microsoft::MultiHeadAttention",
            (q, k, v, None, key_padding_mask.to(torch.int32)),
            {"num_heads": n_heads},
            dtype=q.dtype,
            shape=q.shape,
            version=MS_DOMAIN_VERSION,
        )
    b, s, d = q.shape
    t = k.shape[1]
    dh = d // n_heads
    qh = q.view(b, s, n_heads, dh).transpose(1, 2)  # [B, H, S, Dh]
    kh = k.view(b, t, n_heads, dh).transpose(1, 2)  # [B, H, T, Dh]
    vh = v.view(b, t, n_heads, dh).transpose(1, 2)
    mask = key_padding_mask.bool()[:, None, None, :]  # [B, 1, 1, T], True = may attend
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, dropout_p=dropout)
    return out.transpose(1, 2).reshape(b, s, d)


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection and RoPE on Q and K."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: Tensor, mask: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # each [B, S, D]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        p = self.dropout if self.training else 0.0
        return self.out(fused_attention(q, k, v, mask, self.n_heads, p))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_ff)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.up(x)))


class EncoderBlock(nn.Module):
    """Pre-norm: x + Attn(LN(x)), then x + FFN(LN(x)). Pre-norm trains stably without warm-up tricks."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.attn = SelfAttention(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.d_model)
        self.ffn = FeedForward(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.drop(self.attn(self.attn_norm(x), mask, cos, sin))
        return x + self.drop(self.ffn(self.ffn_norm(x)))


class Encoder(nn.Module):
    """Token ids [B, S] → contextual states [B, S, D] (final LayerNorm applied)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        cos, sin = rope_tables(cfg.max_len, cfg.head_dim, cfg.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.drop(self.embed(input_ids) * math.sqrt(self.cfg.d_model))
        for block in self.blocks:
            x = block(x, attention_mask, self.rope_cos, self.rope_sin)
        return self.norm(x)


class SentimentClassifier(nn.Module):
    """Encoder + masked mean pooling + linear head: ids [B, S], mask [B, S] → logits [B, num_labels]."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.num_labels)
        self.apply(_init_weights)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        h = self.encoder(input_ids, attention_mask)  # [B, S, D]
        m = attention_mask.unsqueeze(-1).to(h.dtype)  # [B, S, 1]
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1.0)  # [B, D]
        return self.head(pooled)


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=module.embedding_dim**-0.5)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
