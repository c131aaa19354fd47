"""PyTorch → ONNX with fused attention, dynamic batch and sequence axes.

`torch.onnx.export(..., dynamo=True)` traces the same forward that trains, with the model's attention
set to "ort_fused" for the export (export/model/attention.py): every attention layer becomes one
`com.microsoft::MultiHeadAttention` node and RoPE `com.microsoft::RotaryEmbedding`. Opset 18 for the
standard ops keeps the files loadable by ONNX Runtime 1.19 (the one inside NGC `tritonserver:24.10-py3`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import onnx
import torch
from torch import nn

from export.model.attention import using_attention

OPSET = 18


def export_encoder_classifier(
    model: nn.Module, out_path: Path, example_len: int = 16, attention: str = "ort_fused", output: str = "logits"
) -> Path:
    """Export a (input_ids, attention_mask) → `output` model with dynamic [batch, seq] axes (the output may have
    the sequence axis too: the extractive summarizer's token scores).

    attention: how the graph computes it, "ort_fused" (the served models) or "sdpa" (plain ONNX ops).
    """
    model = model.eval()
    ids = torch.randint(4, model.cfg.vocab_size, (2, example_len))
    mask = torch.ones_like(ids)
    mask[1, example_len // 2 :] = 0
    batch, seq = torch.export.Dim("batch", min=1, max=1024), torch.export.Dim("sequence", min=1, max=model.cfg.max_len)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with quiet_exporter(), using_attention(model, attention):
        program = torch.onnx.export(
            model,
            (ids, mask),
            dynamo=True,
            opset_version=OPSET,
            input_names=["input_ids", "attention_mask"],
            output_names=[output],
            dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
            external_data=False,
        )
    program.save(str(out_path), external_data=False)
    onnx.checker.check_model(str(out_path))
    return out_path


@contextlib.contextmanager
def quiet_exporter():
    """The exporter prints progress and warnings meant for its developers; keep our logs readable."""
    sink = io.StringIO()
    level = logging.getLogger("torch").level
    logging.getLogger("torch").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink):
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logging.getLogger("torch").setLevel(level)


def count_ops(path: Path) -> dict[str, int]:
    """'domain::OpType' → count, for graph checks (top-level graph only)."""
    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        key = f"{node.domain or 'ai.onnx'}::{node.op_type}"
        counts[key] = counts.get(key, 0) + 1
    return counts
