"""Explain variants of the served models: the same forward, with attention probabilities as outputs.

The fast exported models compute attention in fused kernels (`F.scaled_dot_product_attention` in eager,
`com.microsoft::MultiHeadAttention` in ONNX), which never materialize softmax(Q·Kᵀ/√d). To show what a
model attends to, `explicit_attention()` swaps the three attention functions of `export.model` for the
seed documents' formula written out,

    probs = softmax(Q·Kᵀ/√d_k + mask)        (kept, per layer and head)
    out   = probs · V

and records `probs` while the model's own forward runs. Everything else (embeddings, RoPE, norms,
feed-forward, pooling, heads) is the trained model's code and weights, untouched: the explain model is
the same model, which `tests/test_explain_export.py` checks against the fast forward.

Two explain ONNX models are exported (plain ONNX ops for attention, `com.microsoft::RotaryEmbedding`
for RoPE, as in the fast models; they load in ONNX Runtime 1.19.2 and 1.31):

``sentiment_attention``
    input_ids int64 [B, S], attention_mask int64 [B, S] (1 = token)
    → logits [B, num_labels]; attention [B, L, S, S] (head-averaged self-attention per layer; rows of
      padded query positions are 0, every other row sums to 1)
``translate_attention`` (teacher forcing over a finished translation)
    input_ids int32 [B, S], attention_mask int32 [B, S] (the generator's inputs), decoder_input_ids
    int32 [B, T] (bos, then the generated tokens; right-padded with pad)
    → logits [B, T, V]; cross_attention [B, L, T, S] (head-averaged decoder→source attention per layer;
      row t is what the decoder attended to while predicting target token t+1)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import torch
from torch import Tensor, nn

from export import model as model_module
from export.model import KV, SentimentClassifier, Seq2Seq, merge_heads, split_heads
from export.seq2seq_export import _export as export_module

PATCHED = ("fused_attention", "cross_attention", "causal_attention")


@dataclass
class AttentionRecord:
    """Attention probabilities [B, H, queries, keys] in call order (= layer order within a stack)."""

    encoder: list[Tensor] = field(default_factory=list)  # self-attention of encoders
    decoder: list[Tensor] = field(default_factory=list)  # causal self-attention of the decoder
    cross: list[Tensor] = field(default_factory=list)  # decoder → encoder memory


def attend(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, n_heads: int, bias: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """softmax(Q·Kᵀ/√d + bias + mask)·V with the probabilities kept.

    q: [B, S, H*Dh]; k, v: [B, H, T, Dh]; allowed: bool, broadcastable to [B, H, S, T] (True = may attend);
    bias: None or additive scores broadcastable to [B, H, S, T] (relative positions).
    Returns output [B, S, H*Dh] and probabilities [B, H, S, T].
    """
    qh = split_heads(q, n_heads)  # [B, H, S, Dh]
    scores = qh @ k.transpose(-1, -2) * (1.0 / math.sqrt(qh.shape[-1]))  # [B, H, S, T]
    if bias is not None:
        scores = scores + bias
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return merge_heads(probs @ v), probs


def _padding(key_padding_mask: Tensor) -> Tensor:
    return key_padding_mask.bool()[:, None, None, :]  # [B, 1, 1, T]


@contextlib.contextmanager
def explicit_attention() -> Iterator[AttentionRecord]:
    """Inside the block, every attention of `export.model` is computed explicitly and recorded.

    The replacements keep the signatures of the functions they stand in for; dropout is not applied
    (explaining is inference). Not thread-safe: it swaps module-level functions.
    """
    record = AttentionRecord()

    def self_attention(
        q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor, n_heads: int, dropout: float, bias=None
    ):
        kh, vh = split_heads(k, n_heads), split_heads(v, n_heads)
        out, probs = attend(q, kh, vh, _padding(key_padding_mask), n_heads, bias)
        record.encoder.append(probs)
        return out

    def cross_attention(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor, n_heads: int, dropout: float):
        out, probs = attend(q, k, v, _padding(key_padding_mask), n_heads)
        record.cross.append(probs)
        return out

    def causal_attention(q: Tensor, k: Tensor, v: Tensor, past: KV | None, n_heads: int, dropout: float):
        kh, vh = split_heads(k, n_heads), split_heads(v, n_heads)
        if past is not None:
            kh, vh = torch.cat([past[0], kh], dim=2), torch.cat([past[1], vh], dim=2)
        t = q.shape[1]
        p = kh.shape[2] - t
        allowed = torch.ones(t, p + t, dtype=torch.bool, device=q.device).tril(diagonal=p)  # [T, P+T]
        out, probs = attend(q, kh, vh, allowed, n_heads)
        record.decoder.append(probs)
        return out, (kh, vh)

    replacements = {
        "fused_attention": self_attention,
        "cross_attention": cross_attention,
        "causal_attention": causal_attention,
    }
    saved = {name: getattr(model_module, name) for name in PATCHED}
    for name, function in replacements.items():
        setattr(model_module, name, function)
    try:
        yield record
    finally:
        for name, function in saved.items():
            setattr(model_module, name, function)


def head_average(layers: list[Tensor]) -> Tensor:
    """Per-layer [B, H, S, T] probabilities → [B, L, S, T] averaged over heads (rows still sum to 1)."""
    return torch.stack([p.mean(dim=1) for p in layers], dim=1)


class SentimentExplainer(nn.Module):
    """ids, mask [B, S] → logits [B, num_labels] and self-attention [B, L, S, S] (head-averaged)."""

    def __init__(self, model: SentimentClassifier) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        with explicit_attention() as record:
            logits = self.model(input_ids, attention_mask)
        rows = attention_mask.to(logits.dtype)[:, None, :, None]  # [B, 1, S, 1]: zero padded query rows
        return logits, head_average(record.encoder) * rows


class TranslateExplainer(nn.Module):
    """Teacher forcing over a finished output: source ids/mask [B, S] and decoder input [B, T] →
    logits [B, T, V] and cross-attention [B, L, T, S] (head-averaged)."""

    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, decoder_input_ids: Tensor) -> tuple[Tensor, Tensor]:
        with explicit_attention() as record:
            logits = self.model(input_ids.long(), attention_mask, decoder_input_ids.long())
        return logits, head_average(record.cross)


def _save(module: nn.Module, args: tuple, names_in: list[str], names_out: list[str], shapes, out_path: Path) -> Path:
    """The generator's exporter (dynamo, opset 18, fused RoPE), saved as a standalone model."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(export_module(module, args, names_in, names_out, shapes), str(out_path))
    onnx.checker.check_model(str(out_path))
    return out_path


def export_sentiment_explainer(model: SentimentClassifier, out_path: Path, example_len: int = 16) -> Path:
    """Write `sentiment_attention` (I/O in the module docstring)."""
    ids = torch.randint(4, model.cfg.vocab_size, (2, example_len))
    mask = torch.ones_like(ids)
    mask[1, example_len // 2 :] = 0
    batch = torch.export.Dim("batch", min=1, max=1024)
    seq = torch.export.Dim("sequence", min=1, max=model.cfg.max_len)
    shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    names_out = ["logits", "attention"]
    return _save(SentimentExplainer(model.eval()), (ids, mask), list(shapes), names_out, shapes, out_path)


def export_translate_explainer(model: Seq2Seq, out_path: Path) -> Path:
    """Write `translate_attention` (I/O in the module docstring)."""
    cfg = model.cfg
    ids = torch.randint(4, cfg.vocab_size, (3, 7), dtype=torch.int32)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    target = torch.randint(4, cfg.target_vocab_size, (3, 5), dtype=torch.int32)
    target[:, 0] = cfg.bos_id
    batch = torch.export.Dim("batch", min=1, max=1024)
    source = torch.export.Dim("source_sequence", min=1, max=cfg.max_len)
    decoded = torch.export.Dim("target_sequence", min=1, max=cfg.max_len)
    shapes = {
        "input_ids": {0: batch, 1: source},
        "attention_mask": {0: batch, 1: source},
        "decoder_input_ids": {0: batch, 1: decoded},
    }
    names_out = ["logits", "cross_attention"]
    return _save(TranslateExplainer(model.eval()), (ids, mask, target), list(shapes), names_out, shapes, out_path)


def export_explainer(task: str, checkpoint: Path, out_path: Path) -> Path:
    """Export the explain model of a trained `task` ("sentiment" or "translate") from its checkpoint folder."""
    if task == "sentiment":
        from export import sentiment

        classifier, _, _ = sentiment.load(checkpoint)
        return export_sentiment_explainer(classifier, out_path)
    if task == "translate":
        from export import seq2seq

        seq2seq_model, _, _, _ = seq2seq.load(checkpoint)
        return export_translate_explainer(seq2seq_model, out_path)
    raise ValueError(f"no explain model for task {task!r}: sentiment or translate")
