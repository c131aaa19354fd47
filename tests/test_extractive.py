"""The extractive summarizer (export/training/extractive.py): its training run, and its ONNX export against PyTorch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from benchmarks.data import available, fallback_texts
from export.graphs.onnx_export import count_ops, export_encoder_classifier
from export.train import main as train_main
from export.training import extractive
from export.training.data import DEFAULT_DATA_DIR, read_summarization
from export.training.loop import pad_batch

pytestmark = pytest.mark.export
SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "summarize" / extractive.EXTRACTOR_FOLDER


def test_tiny_extractive_run_starts_from_a_summarize_checkpoint(fake_data_dir, tmp_path):
    init = tmp_path / "summarize"
    argv = ["summarize", "--data-dir", str(fake_data_dir), "--out", str(init), "--state", str(tmp_path / "s.pt")]
    argv += ["--epochs", "1", "--minutes", "1", "--eval-limit", "2", "--d-model", "32", "--layers", "1"]
    argv += ["--decoder-layers", "1", "--heads", "2", "--d-ff", "64", "--keep", "last"]
    assert train_main(argv) == 0
    out = tmp_path / "extractor"
    argv = ["summarize", "--extractive", "--init", str(init), "--data-dir", str(fake_data_dir), "--out", str(out)]
    argv += ["--state", str(tmp_path / "e.pt"), "--epochs", "2", "--minutes", "1"]
    assert train_main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["command"].startswith("python -m export.train summarize --extractive")
    assert {"extractive", "lead_baseline", "first_sentence_baseline", "oracle_span"} <= set(metrics["test"])
    assert metrics["history"]["selected"] == {"dev_rougeL": max(e["dev_rougeL"] for e in metrics["history"]["epochs"])}
    model, _, _ = extractive.load(out)
    from export.training import seq2seq

    generator, _, _, _ = seq2seq.load(init)
    assert model.encoder.embed.weight.shape == generator.encoder.embed.weight.shape  # the same vocabulary


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    model, config, tokenizer = extractive.load(SHIPPED)
    path = export_encoder_classifier(model, tmp_path_factory.mktemp("x") / "model.onnx", output="token_scores")
    return model, config, tokenizer, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), path


def test_the_export_is_fused_attention_and_matches_pytorch_on_padded_batches(shipped):
    model, config, tokenizer, session, path = shipped
    assert count_ops(path).get("com.microsoft::MultiHeadAttention") == config["model"]["n_layers"]
    texts = ["今天天气很好，我们去公园。", "国家统计局今天发布数据，上半年国内生产总值同比增长百分之七。", "好"]
    examples = [extractive.make_example(t, tokenizer, config["max_tokens"]) for t in texts]
    ids, mask = pad_batch([e.candidates.ids for e in examples])
    (scores,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        expected = model(ids, mask).numpy()
    real = mask.numpy().astype(bool)
    np.testing.assert_allclose(scores[real], expected[real], atol=1e-4)


def test_onnx_picks_the_same_spans_as_pytorch_on_the_test_set(shipped):
    model, config, tokenizer, session, _ = shipped
    if available(DEFAULT_DATA_DIR, "summarize"):
        texts = [p.source for p in read_summarization(DEFAULT_DATA_DIR)[1][:200]]
    else:  # no data folder: the load test's built-in news texts
        texts = fallback_texts("summarize")
    examples = [extractive.make_example(text, tokenizer, config["max_tokens"]) for text in texts]
    expected = extractive.pick(model, examples)
    picked = []
    for e in examples:
        ids = np.array([e.candidates.ids], dtype=np.int64)
        (scores,) = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        best = int(np.argmax([scores[0, p].mean() for p in e.candidates.positions]))
        picked.append(e.candidates.texts[best])
    agreed = sum(a == b for a, b in zip(picked, expected, strict=True))
    assert agreed >= len(texts) - len(texts) // 100, "ties may break either way: 1% may differ"
