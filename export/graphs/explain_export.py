"""Explain variants of the served models: the same forward, with attention probabilities as outputs.

The fast exported models compute attention in fused kernels (`F.scaled_dot_product_attention` in eager,
`com.microsoft::MultiHeadAttention` in ONNX), which never materialize softmax(Q·Kᵀ/√d). To show what a
model attends to, the explain variants run the model's own forward with an `AttentionRecord`: every
attention is then computed with the seed documents' formula written out (export/model/attention.py, "explicit"),

    probs = softmax(Q·Kᵀ/√d_k + mask)        (kept, per layer and head)
    out   = probs · V

and `probs` is recorded. Everything else (embeddings, RoPE, norms, feed-forward, pooling, heads) is the
trained model's code and weights, untouched: the explain model is the same model, which
`tests/test_explain_export.py` checks against the fast forward.

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

from pathlib import Path

import onnx
import torch
from torch import Tensor, nn

from export.graphs.seq2seq_export import export_module
from export.model.attention import AttentionRecord
from export.model.transformer import SentimentClassifier, Seq2Seq


def head_average(layers: list[Tensor]) -> Tensor:
    """Per-layer [B, H, S, T] probabilities → [B, L, S, T] averaged over heads (rows still sum to 1)."""
    return torch.stack([p.mean(dim=1) for p in layers], dim=1)


class SentimentExplainer(nn.Module):
    """ids, mask [B, S] → logits [B, num_labels] and self-attention [B, L, S, S] (head-averaged)."""

    def __init__(self, model: SentimentClassifier) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        record = AttentionRecord()
        logits = self.model(input_ids, attention_mask, record)
        rows = attention_mask.to(logits.dtype)[:, None, :, None]  # [B, 1, S, 1]: zero padded query rows
        return logits, head_average(record.encoder) * rows


class TranslateExplainer(nn.Module):
    """Teacher forcing over a finished output: source ids/mask [B, S] and decoder input [B, T] →
    logits [B, T, V] and cross-attention [B, L, T, S] (head-averaged)."""

    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, decoder_input_ids: Tensor) -> tuple[Tensor, Tensor]:
        record = AttentionRecord()
        logits = self.model(input_ids.long(), attention_mask, decoder_input_ids.long(), record)
        return logits, head_average(record.cross)


def _save(module: nn.Module, args: tuple, names_in: list[str], names_out: list[str], shapes, out_path: Path) -> Path:
    """The generator's exporter (dynamo, opset 18, "ort_fused": the RoPE stays fused, the recorded attention
    is explicit), saved as a standalone model."""
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
        from export.training import sentiment

        classifier, _, _ = sentiment.load(checkpoint)
        return export_sentiment_explainer(classifier, out_path)
    if task == "translate":
        from export.training import seq2seq

        seq2seq_model, _, _, _ = seq2seq.load(checkpoint)
        return export_translate_explainer(seq2seq_model, out_path)
    raise ValueError(f"no explain model for task {task!r}: sentiment or translate")
