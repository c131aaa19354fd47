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

Positions can also be given the other ways the seed documents compare (ModelConfig.positional,
measured in ABLATION.md): sinusoidal or learned absolute embeddings added to the tokens, or a learned
bias a_{i-j} added to the attention scores. RoPE stays the default and the only scheme of the
encoder-decoder and of the served models.

Two models are built from these pieces: `SentimentClassifier` (encoder + pooled head) and
`Seq2Seq` (encoder + causal decoder with cross-attention and a KV cache, for translation and
summarization). Keys and values are cached in the BNSH layout [B, H, T, Dh], the layout of
MultiHeadAttention's past/present tensors and of ONNX Runtime's BeamSearch op.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MS_DOMAIN_VERSION = 1
POSITIONAL_SCHEMES = ("rope", "sinusoidal", "learned", "relative_bias")
_EMIT_FUSED_OPS = True


def emits_fused_ops() -> bool:
    """True while exporting to ONNX with fused operators (the default); False in eager or decomposed export."""
    return _EMIT_FUSED_OPS and torch.onnx.is_in_onnx_export()


@contextlib.contextmanager
def decomposed_attention():
    """Export plain ONNX ops (MatMul, Softmax, …) instead of the fused ones: the benchmarks' baseline."""
    global _EMIT_FUSED_OPS
    saved, _EMIT_FUSED_OPS = _EMIT_FUSED_OPS, False
    try:
        yield
    finally:
        _EMIT_FUSED_OPS = saved


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
    # Encoder-decoder fields; the defaults mean "encoder only" so sentiment configs load unchanged.
    tgt_vocab_size: int = 0  # 0 → same vocabulary as the source
    n_decoder_layers: int = 0
    bos_id: int = 2  # decoder start token (the project's tokenizers: pad 0, unk 1, bos 2, eos 3)
    eos_id: int = 3
    # How attention learns where tokens are; one of POSITIONAL_SCHEMES (see the section "Positions" below).
    positional: str = "rope"
    relative_buckets: int = 32  # "relative_bias": T5's buckets of i - j, half per direction
    relative_max_distance: int = 128  # "relative_bias": distances from here on share the last bucket
    # Encoder-decoder with one vocabulary: mix a pointer (copy) distribution over the source tokens into
    # the output (See et al. 2017). Summaries copy phrases from their text; see CopyPointer below.
    copy: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def target_vocab_size(self) -> int:
        return self.tgt_vocab_size or self.vocab_size

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.positional not in POSITIONAL_SCHEMES:
            raise ValueError(f"positional={self.positional!r} is not one of {', '.join(POSITIONAL_SCHEMES)}")
        if self.positional == "rope" and self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"d_model={self.d_model} must be even for sinusoidal positions (sin/cos pairs)")
        if self.copy and self.tgt_vocab_size not in (0, self.vocab_size):
            raise ValueError("copy needs one vocabulary for source and target (tgt_vocab_size 0 or vocab_size)")
        if self.positional == "relative_bias" and (self.relative_buckets < 4 or self.relative_buckets % 4):
            raise ValueError(f"relative_buckets={self.relative_buckets} must be a positive multiple of 4")


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
    if emits_fused_ops():
        # torch.full keeps a symbolic offset (the KV-cache length) dynamic; as_tensor would freeze it.
        if isinstance(offset, Tensor):
            position = offset.reshape(1).to(torch.int64)
        else:
            position = torch.full((1,), offset, dtype=torch.int64)
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
# Positions: the other schemes of the seed's comparison (encoder only; RoPE is above)
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------


KV = tuple[Tensor, Tensor]  # (key, value), each [B, H, T, Dh]


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """[B, S, H*Dh] → [B, H, S, Dh] (BNSH, the KV-cache layout)."""
    b, s, d = x.shape
    return x.view(b, s, n_heads, d // n_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """[B, H, S, Dh] → [B, S, H*Dh]."""
    b, h, s, dh = x.shape
    return x.transpose(1, 2).reshape(b, s, h * dh)


def fused_attention(
    q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor, n_heads: int, dropout: float, bias: Tensor | None = None
) -> Tensor:
    """softmax(Q·Kᵀ/√d + bias)·V over heads, ignoring padded keys.

    q: [B, S, D]; k, v: [B, T, D]; key_padding_mask: [B, T] (1 = real token, 0 = padding);
    bias: None or [1, H, S, T] (relative positions). Returns [B, S, D]. In export this is one
    `com.microsoft::MultiHeadAttention` node (the bias is its attention_bias input).
    """
    if emits_fused_ops():
        inputs = (q, k, v, None, key_padding_mask.to(torch.int32))
        return torch.onnx.ops.symbolic(
            "com.microsoft::MultiHeadAttention",
            inputs if bias is None else (*inputs, bias),  # input 5: attention_bias [1, H, S, T]
            {"num_heads": n_heads},
            dtype=q.dtype,
            shape=q.shape,
            version=MS_DOMAIN_VERSION,
        )
    qh, kh, vh = split_heads(q, n_heads), split_heads(k, n_heads), split_heads(v, n_heads)  # [B, H, ·, Dh]
    mask = key_padding_mask.bool()[:, None, None, :]  # [B, 1, 1, T], True = may attend
    if bias is not None:  # e_ij = q_i·k_j/√d + a_{i-j}, written out: SDPA with a float mask does not export
        scores = qh @ kh.transpose(-1, -2) / math.sqrt(qh.shape[-1]) + bias  # [B, H, S, T]
        probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)  # padded keys get 0
        return merge_heads(F.dropout(probs, dropout) @ vh)
    return merge_heads(F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, dropout_p=dropout))


MASK_FILTER_VALUE = -10000.0  # ORT's default for masked scores; finite, so fp16-safe


def cross_attention(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor, n_heads: int, dropout: float) -> Tensor:
    """Decoder queries over keys/values projected once from the encoder memory.

    q: [B, T, D]; k, v: [B, H, S, Dh] (BNSH, BeamSearch's past_key_cross_i); key_padding_mask:
    [B, S]. Returns [B, T, D]. In export this is one `com.microsoft::MultiHeadAttention` node whose
    padding mask is an additive bias [B, H, T, S]: ORT 1.19's CPU kernel ignores key_padding_mask
    when the query and key lengths differ (measured), the bias works in 1.19 and 1.31.
    """
    if emits_fused_ops():
        b, t, _ = q.shape
        padded = (key_padding_mask == 0).to(q.dtype)[:, None, None, :]  # [B, 1, 1, S]
        bias = (padded * MASK_FILTER_VALUE).expand(b, n_heads, t, k.shape[2])  # 1.19 wants all four dims
        return torch.onnx.ops.symbolic(
            "com.microsoft::MultiHeadAttention",
            (q, k, v, None, None, bias),
            {"num_heads": n_heads},
            dtype=q.dtype,
            shape=q.shape,
            version=MS_DOMAIN_VERSION,
        )
    mask = key_padding_mask.bool()[:, None, None, :]  # [B, 1, 1, S], True = may attend
    out = F.scaled_dot_product_attention(split_heads(q, n_heads), k, v, attn_mask=mask, dropout_p=dropout)
    return merge_heads(out)


def causal_attention(
    q: Tensor, k: Tensor, v: Tensor, past: KV | None, n_heads: int, dropout: float
) -> tuple[Tensor, KV]:
    """Causal self-attention over cached keys/values plus the new positions.

    q, k, v: [B, T, D] for the T new positions (RoPE already applied at offset P = past length);
    past: (key, value) [B, H, P, Dh] or None. Returns output [B, T, D] and the present (key, value)
    [B, H, P+T, Dh]. Query i sits at position P+i and sees keys 0..P+i. In export this is one
    `com.microsoft::MultiHeadAttention` node with past_key/past_value inputs and present outputs.
    """
    b, t, d = q.shape
    dh = d // n_heads
    if emits_fused_ops():
        past_len = 0 if past is None else past[0].shape[2]
        present_shape = (b, n_heads, past_len + t, dh)
        inputs = (q, k, v) if past is None else (q, k, v, None, None, None, past[0], past[1])
        # One new position (BeamSearch's decoding step) needs no mask; leaving `unidirectional` off
        # then keeps the node runnable by kernels that lack it (e.g. ORT's WebGPU MHA).
        one_step = isinstance(t, int) and t == 1
        attrs = {"num_heads": n_heads} if one_step else {"num_heads": n_heads, "unidirectional": 1}
        out, present_k, present_v = torch.onnx.ops.symbolic_multi_out(
            "com.microsoft::MultiHeadAttention",
            inputs,
            attrs,
            dtypes=(q.dtype, q.dtype, q.dtype),
            shapes=(q.shape, present_shape, present_shape),
            version=MS_DOMAIN_VERSION,
        )
        return out, (present_k, present_v)
    kh, vh = split_heads(k, n_heads), split_heads(v, n_heads)  # [B, H, T, Dh]
    if past is not None:
        kh, vh = torch.cat([past[0], kh], dim=2), torch.cat([past[1], vh], dim=2)  # [B, H, P+T, Dh]
    p = kh.shape[2] - t
    allowed = None  # one new position (t == 1) sees everything cached
    if t > 1:
        allowed = torch.ones(t, p + t, dtype=torch.bool, device=q.device).tril(diagonal=p)  # [T, P+T]
    qh = split_heads(q, n_heads)  # [B, H, T, Dh]
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed, dropout_p=dropout)
    return merge_heads(out), (kh, vh)


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection and RoPE on Q and K.

    Without RoPE tables (cos = sin = None) Q and K are not rotated; `bias` adds relative-position
    scores. Both belong to the positional ablation; the served models use RoPE.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(
        self, x: Tensor, mask: Tensor, cos: Tensor | None, sin: Tensor | None, bias: Tensor | None = None
    ) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # each [B, S, D]
        if cos is not None:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        p = self.dropout if self.training else 0.0
        return self.out(fused_attention(q, k, v, mask, self.n_heads, p, bias))


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

    def forward(
        self, x: Tensor, mask: Tensor, cos: Tensor | None, sin: Tensor | None, bias: Tensor | None = None
    ) -> Tensor:
        x = x + self.drop(self.attn(self.attn_norm(x), mask, cos, sin, bias))
        return x + self.drop(self.ffn(self.ffn_norm(x)))


class Encoder(nn.Module):
    """Token ids [B, S] → contextual states [B, S, D] (final LayerNorm applied).

    Positions per `cfg.positional`: "rope" rotates Q and K in every layer; "sinusoidal" and
    "learned" add a table row per position to the token embeddings (a learned row exists only for
    positions seen in training: longer inputs reach rows that never got a gradient); "relative_bias"
    adds a_{i-j} to the attention scores.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        if cfg.positional == "rope":
            cos, sin = rope_tables(cfg.max_len, cfg.head_dim, cfg.rope_base)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        elif cfg.positional == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)
        elif cfg.positional == "learned":
            self.pos_embed = nn.Embedding(cfg.max_len, cfg.d_model)  # one trained row per position
        else:
            self.rel_bias = RelativePositionBias(cfg)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        s = input_ids.shape[1]
        if not torch.onnx.is_in_onnx_export() and s > self.cfg.max_len:
            raise ValueError(f"sequence of {s} tokens is longer than max_len={self.cfg.max_len}; truncate it")
        x = self.embed(input_ids) * math.sqrt(self.cfg.d_model)  # [B, S, D]
        cos = sin = bias = None
        if self.cfg.positional == "rope":
            cos, sin = self.rope_cos, self.rope_sin
        elif self.cfg.positional == "sinusoidal":
            x = x + self.pos_table[:s]
        elif self.cfg.positional == "learned":
            x = x + self.pos_embed.weight[:s] * math.sqrt(self.cfg.d_model)  # same scale as the tokens
        else:
            bias = self.rel_bias(s)  # [1, H, S, S]
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, attention_mask, cos, sin, bias)
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


class MaskedLanguageModel(nn.Module):
    """Pre-training head for an encoder: predict masked tokens from both sides (BERT's objective).

    Shares the encoder object (and ties the output projection to its token embedding), so after
    pre-training the same encoder goes into the classifier.
    """

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder
        self.bias = nn.Parameter(torch.zeros(encoder.cfg.vocab_size))

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        h = self.encoder(input_ids, attention_mask)  # [B, S, D]
        return h @ self.encoder.embed.weight.T + self.bias  # [B, S, V]


# ---------------------------------------------------------------------------------------------
# Encoder-decoder (translation, summarization)
# ---------------------------------------------------------------------------------------------


class CausalSelfAttention(SelfAttention):
    """Decoder self-attention: the encoder's fused QKV and RoPE, plus a causal mask and a KV cache.

    RoPE positions continue from the cache: new position i is rotated by angle(P + i).
    """

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, past: KV | None = None) -> tuple[Tensor, KV]:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # each [B, T, D]
        offset = 0 if past is None else past[0].shape[2]
        q, k = apply_rope(q, cos, sin, offset), apply_rope(k, cos, sin, offset)
        p = self.dropout if self.training else 0.0
        out, present = causal_attention(q, k, v, past, self.n_heads, p)
        return self.out(out), present


class CrossAttention(nn.Module):
    """Decoder queries over the encoder memory. No RoPE: source and target positions are unrelated.

    The memory's keys and values are projected once per source (`project_memory`) and reused at
    every decoding step, which is what BeamSearch's `past_key_cross_i` inputs hold.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.dropout = cfg.dropout
        self.q = nn.Linear(cfg.d_model, cfg.d_model)
        self.kv = nn.Linear(cfg.d_model, 2 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def project_memory(self, memory: Tensor) -> KV:
        k, v = self.kv(memory).chunk(2, dim=-1)  # each [B, S, D]
        return split_heads(k, self.n_heads), split_heads(v, self.n_heads)  # each [B, H, S, Dh]

    def forward(self, x: Tensor, memory_kv: KV, src_mask: Tensor) -> Tensor:
        p = self.dropout if self.training else 0.0
        return self.out(cross_attention(self.q(x), memory_kv[0], memory_kv[1], src_mask, self.n_heads, p))


class DecoderBlock(nn.Module):
    """Pre-norm: x + SelfAttn(LN(x)) (causal, cached), x + CrossAttn(LN(x), memory), x + FFN(LN(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.cross_norm = nn.LayerNorm(cfg.d_model)
        self.cross_attn = CrossAttention(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.d_model)
        self.ffn = FeedForward(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self, x: Tensor, src_mask: Tensor, memory_kv: KV, cos: Tensor, sin: Tensor, past: KV | None = None
    ) -> tuple[Tensor, KV]:
        h, present = self.attn(self.attn_norm(x), cos, sin, past)
        x = x + self.drop(h)
        x = x + self.drop(self.cross_attn(self.cross_norm(x), memory_kv, src_mask))
        return x + self.drop(self.ffn(self.ffn_norm(x))), present


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
        """h [B, T, D] (normed decoder state), logits [B, T, V] → log p [B, T, V] (float32)."""
        keys, ids = pointer_kv
        q = split_heads(self.query(h), self.n_heads)  # [B, H, T, Dh]
        scores = (q @ keys.transpose(-1, -2)).float() / math.sqrt(q.shape[-1])  # [B, H, T, S]
        padded = (src_mask == 0)[:, None, None, :]
        attention = scores.masked_fill(padded, MASK_FILTER_VALUE).softmax(-1).mean(1)  # [B, T, S]
        source = ids[:, 0, :, 0].long()[:, None, :].expand_as(attention)  # [B, T, S]
        copied = torch.zeros_like(logits, dtype=torch.float32).scatter_add(-1, source, attention)
        g = torch.sigmoid(self.gate(h).float())  # [B, T, 1]
        return torch.log(g * logits.float().softmax(-1) + (1 - g) * copied + 1e-9)


class Decoder(nn.Module):
    """Target ids [B, T] + projected memory → next-token logits [B, T, V] and the present KV cache.

    The output projection is tied to the target embedding (logits = LN(h) · Eᵀ). With `cfg.copy`
    the last pair of the projected memory is the pointer's (see CopyPointer) and the result is log p.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # No padding_idx: with the tied output projection every row is also a logit.
        self.embed = nn.Embedding(cfg.target_vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.n_decoder_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.pointer = CopyPointer(cfg) if cfg.copy else None
        cos, sin = rope_tables(cfg.max_len, cfg.head_dim, cfg.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def project_memory(self, memory: Tensor, src_ids: Tensor | None = None) -> list[KV]:
        """Encoder memory [B, S, D] → per layer cross-attention (key, value) [B, H, S, Dh], and with
        `cfg.copy` the pointer's pair last (it needs the source ids)."""
        layers = [block.cross_attn.project_memory(memory) for block in self.blocks]
        if self.pointer is None:
            return layers
        if src_ids is None:
            raise ValueError("a copying decoder needs the source ids to project the memory")
        return [*layers, self.pointer.project_memory(memory, src_ids)]

    def forward(
        self, tgt_ids: Tensor, src_mask: Tensor, memory_kv: list[KV], past: list[KV] | None = None
    ) -> tuple[Tensor, list[KV]]:
        x = self.drop(self.embed(tgt_ids) * math.sqrt(self.cfg.d_model))  # [B, T, D]
        presents = []
        for i, block in enumerate(self.blocks):
            layer_past = None if past is None else past[i]
            x, present = block(x, src_mask, memory_kv[i], self.rope_cos, self.rope_sin, layer_past)
            presents.append(present)
        h = self.norm(x)
        logits = F.linear(h, self.embed.weight)  # [B, T, V]
        if self.pointer is not None:
            logits = self.pointer(h, logits, memory_kv[-1], src_mask)
        return logits, presents


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


class Seq2Seq(nn.Module):
    """RoPE encoder-decoder: source ids [B, S] + target prefix [B, T] → next-token logits [B, T, V].

    `forward` is teacher forcing for training (tgt_in starts with bos); `encode` + `decode` with a
    `KVCache` generate one token at a time (see export/generation.py).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.n_decoder_layers < 1:
            raise ValueError("Seq2Seq needs n_decoder_layers >= 1")
        if cfg.positional != "rope":
            raise ValueError(
                f"Seq2Seq supports positional='rope' only, not {cfg.positional!r}: the other schemes are encoder-only"
            )
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.apply(_init_weights)

    def encode(self, src_ids: Tensor, src_mask: Tensor) -> Tensor:
        """src_ids [B, S] int64, src_mask [B, S] (1 = token) → memory [B, S, D]."""
        return self.encoder(src_ids, src_mask)

    def decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: KVCache | None = None,
        src_ids: Tensor | None = None,
    ) -> Tensor:
        """Causal logits [B, T, V] for tgt_ids [B, T].

        Without a cache this is the teacher-forced pass. With one, tgt_ids are the positions after
        `cache.length`; the cache is filled (cross K/V on first use) and extended in place.
        A copying model (`cfg.copy`) needs `src_ids` whenever the memory is projected.
        """
        if cache is None:
            logits, _ = self.decoder(tgt_ids, src_mask, self.decoder.project_memory(memory, src_ids))
            return logits
        if cache.cross_kv is None:
            cache.cross_kv = self.decoder.project_memory(memory, src_ids)
        logits, cache.self_kv = self.decoder(tgt_ids, src_mask, cache.cross_kv, cache.self_kv)
        return logits

    def forward(self, src_ids: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        return self.decode(tgt_in, self.encode(src_ids, src_mask), src_mask, src_ids=src_ids)


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
