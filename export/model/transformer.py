"""The Transformer: token embeddings → pre-norm blocks of multi-head self-attention with rotary position
embeddings (RoPE) and a feed-forward network → a task head. This follows the seed documents step by step:

    Q = x @ W_Q, K = x @ W_K, V = x @ W_V          (one fused projection here)
    Q, K = rotate(Q, pos), rotate(K, pos)           (RoPE: q·k depends on i - j only)
    out = softmax(Q @ K.T / sqrt(d_k)) @ V          (export/model/attention.py)
    MultiHead = Concat(head_1..head_h) @ W_O

Two models are built from these pieces: `SentimentClassifier` (encoder + pooled head) and `Seq2Seq`
(encoder + causal decoder with cross-attention and a KV cache, for translation and summarization).
How attention is computed (PyTorch's SDPA, ONNX Runtime's fused operators, or written out with its
probabilities) is a value the attention modules carry: see export/model/attention.py. The positional schemes
besides RoPE live in export/model/positional.py, the masked-LM and copy heads in export/model/heads.py.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from export.model.attention import KV, AttentionLayer, AttentionRecord, KVCache, group_by_source, split_heads
from export.model.config import ModelConfig
from export.model.heads import CopyPointer
from export.model.positional import RelativePositionBias, apply_rope, rope_tables, sinusoidal_table

# ---------------------------------------------------------------------------------------------
# Encoder
# ---------------------------------------------------------------------------------------------


class SelfAttention(AttentionLayer):
    """Multi-head self-attention with one fused QKV projection and RoPE on Q and K.

    Without RoPE tables (cos = sin = None) Q and K are not rotated; `bias` adds relative-position
    scores. Both belong to the positional ablation; the served models use RoPE.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg.n_heads, cfg.dropout)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def project(
        self, x: Tensor, cos: Tensor | None, sin: Tensor | None, offset: int = 0, starts: Tensor | None = None
    ) -> tuple[Tensor, ...]:
        """q, k, v [B, S, D], q and k rotated for positions offset.. (or per row starts[b]..; ORT's
        RotaryEmbedding when fused)."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if cos is not None:
            fused = self.attn_implementation == "ort_fused"
            q, k = (apply_rope(t, cos, sin, offset, fused, starts) for t in (q, k))
        return q, k, v

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        cos: Tensor | None,
        sin: Tensor | None,
        bias: Tensor | None = None,
        record: AttentionRecord | None = None,
    ) -> Tensor:
        q, k, v = self.project(x, cos, sin)
        probs = None if record is None else record.encoder
        return self.out(self.attend(q, k, v, probs, key_padding_mask=mask, bias=bias).out)


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_ff)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(gelu(self.up(x)))


def gelu(x: Tensor) -> Tensor:
    """The exact (erf) GELU. Exported, it is written out as x·(1 + erf(x/√2))·0.5: the order ONNX Runtime's
    Gelu fusion recognises, so the served graph runs one BiasGelu node (the up-projection's bias included)
    instead of six element-wise ones; torch's own export of F.gelu multiplies in an order it does not."""
    if torch.onnx.is_in_onnx_export():
        return x * (1.0 + torch.erf(x / math.sqrt(2.0))) * 0.5
    return F.gelu(x)


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
        self,
        x: Tensor,
        mask: Tensor,
        cos: Tensor | None,
        sin: Tensor | None,
        bias: Tensor | None = None,
        record: AttentionRecord | None = None,
    ) -> Tensor:
        x = x + self.drop(self.attn(self.attn_norm(x), mask, cos, sin, bias, record))
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

    def forward(self, input_ids: Tensor, attention_mask: Tensor, record: AttentionRecord | None = None) -> Tensor:
        """`record`, when given, receives every layer's attention probabilities (computed explicitly)."""
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
            x = block(x, attention_mask, cos, sin, bias, record)
        return self.norm(x)


class SentimentClassifier(nn.Module):
    """Encoder + masked mean pooling + linear head: ids [B, S], mask [B, S] → logits [B, num_labels]."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.num_labels)
        self.apply(_init_weights)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, record: AttentionRecord | None = None) -> Tensor:
        h = self.encoder(input_ids, attention_mask, record)  # [B, S, D]
        m = attention_mask.unsqueeze(-1).to(h.dtype)  # [B, S, 1]
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1.0)  # [B, D]
        return self.head(pooled)


# ---------------------------------------------------------------------------------------------
# Encoder-decoder (translation, summarization)
# ---------------------------------------------------------------------------------------------


class CausalSelfAttention(SelfAttention):
    """Decoder self-attention: the encoder's fused QKV and RoPE, plus a causal mask and a KV cache.

    x [B, T, D] holds the T new positions; past (key, value) [B, H, P, Dh] the cached ones. RoPE
    positions continue from the cache: new position i is rotated by angle(P + i). Returns the output
    [B, T, D] and the present (key, value) [B, H, P+T, Dh].

    Rows at different positions in one batch (continuous batching) give `starts` [B], each row's position
    (one new token per row); `past` is then a buffer [B, H, C, Dh] holding row b's starts[b] cached keys at
    its start, and the present is that buffer with the new key written at column starts[b]
    (export/model/attention.py, `cache_lengths`).
    """

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        past: KV | None = None,
        record: AttentionRecord | None = None,
        starts: Tensor | None = None,
    ) -> tuple[Tensor, KV]:
        q, k, v = self.project(x, cos, sin, 0 if past is None else past[0].shape[2], starts)
        probs = None if record is None else record.decoder
        out, present, _ = self.attend(q, k, v, probs, causal=True, past=past, cache_lengths=starts)
        return self.out(out), present


class CrossAttention(AttentionLayer):
    """Decoder queries over the encoder memory. No RoPE: source and target positions are unrelated.

    The memory's keys and values are projected once per source (`project_memory`) and reused at
    every decoding step, which is what BeamSearch's `past_key_cross_i` inputs hold.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg.n_heads, cfg.dropout)
        self.q = nn.Linear(cfg.d_model, cfg.d_model)
        self.kv = nn.Linear(cfg.d_model, 2 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def project_memory(self, memory: Tensor) -> KV:
        k, v = self.kv(memory).chunk(2, dim=-1)  # each [B, S, D]
        return split_heads(k, self.n_heads), split_heads(v, self.n_heads)  # each [B, H, S, Dh]

    def forward(self, x: Tensor, memory_kv: KV, src_mask: Tensor, record: AttentionRecord | None = None) -> Tensor:
        """x [R, T, D]; memory_kv [B, H, S, Dh] with R = B · rows per source (a source's rows consecutive)."""
        probs = None if record is None else record.cross
        q = group_by_source(self.q(x), memory_kv[0].shape[0])
        return self.out(self.attend(q, *memory_kv, probs, key_padding_mask=src_mask).out.reshape(x.shape))


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
        self,
        x: Tensor,
        src_mask: Tensor,
        memory_kv: KV,
        cos: Tensor,
        sin: Tensor,
        past: KV | None = None,
        record: AttentionRecord | None = None,
        starts: Tensor | None = None,
    ) -> tuple[Tensor, KV]:
        h, present = self.attn(self.attn_norm(x), cos, sin, past, record, starts)
        x = x + self.drop(h)
        x = x + self.drop(self.cross_attn(self.cross_norm(x), memory_kv, src_mask, record))
        return x + self.drop(self.ffn(self.ffn_norm(x))), present


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
        self,
        tgt_ids: Tensor,
        src_mask: Tensor,
        memory_kv: list[KV],
        past: list[KV] | None = None,
        record: AttentionRecord | None = None,
        starts: Tensor | None = None,
    ) -> tuple[Tensor, list[KV]]:
        """`starts`: rows at different positions, see CausalSelfAttention."""
        x = self.drop(self.embed(tgt_ids) * math.sqrt(self.cfg.d_model))  # [B, T, D]
        presents = []
        for i, block in enumerate(self.blocks):
            layer_past = None if past is None else past[i]
            rope = self.rope_cos, self.rope_sin
            x, present = block(x, src_mask, memory_kv[i], *rope, layer_past, record, starts)
            presents.append(present)
        h = self.norm(x)
        logits = F.linear(h, self.embed.weight)  # [B, T, V]
        if self.pointer is not None:
            logits = self.pointer(h, logits, memory_kv[-1], src_mask)
        return logits, presents


class Seq2Seq(nn.Module):
    """RoPE encoder-decoder: source ids [B, S] + target prefix [B, T] → next-token logits [B, T, V].

    `forward` is teacher forcing for training (tgt_in starts with bos); `encode` + `decode` with a
    `KVCache` generate one token at a time (see export/model/reference_search.py). A `record`, when given,
    receives every attention's probabilities (computed explicitly).
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

    def encode(self, src_ids: Tensor, src_mask: Tensor, record: AttentionRecord | None = None) -> Tensor:
        """src_ids [B, S] int64, src_mask [B, S] (1 = token) → memory [B, S, D]."""
        return self.encoder(src_ids, src_mask, record)

    def decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: KVCache | None = None,
        src_ids: Tensor | None = None,
        record: AttentionRecord | None = None,
    ) -> Tensor:
        """Causal logits [B, T, V] for tgt_ids [B, T].

        Without a cache this is the teacher-forced pass. With one, tgt_ids are the positions after
        `cache.length`; the cache is filled (cross K/V on first use) and extended in place.
        A copying model (`cfg.copy`) needs `src_ids` whenever the memory is projected.
        """
        if cache is None:
            memory_kv = self.decoder.project_memory(memory, src_ids)
            return self.decoder(tgt_ids, src_mask, memory_kv, record=record)[0]
        if cache.cross_kv is None:
            cache.cross_kv = self.decoder.project_memory(memory, src_ids)
        logits, cache.self_kv = self.decoder(tgt_ids, src_mask, cache.cross_kv, cache.self_kv, record)
        return logits

    def forward(self, src_ids: Tensor, src_mask: Tensor, tgt_in: Tensor, record: AttentionRecord | None = None):
        memory = self.encode(src_ids, src_mask, record)
        return self.decode(tgt_in, memory, src_mask, src_ids=src_ids, record=record)


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
