"""ONNX export: fused attention by construction, parity with PyTorch, loads in the NGC image's ORT."""

import numpy as np
import onnxruntime as ort
import pytest
import torch

from export.graphs.onnx_export import count_ops, export_encoder_classifier
from export.model.config import ModelConfig
from export.model.transformer import SentimentClassifier

CFG = ModelConfig(vocab_size=300, d_model=64, n_heads=4, n_layers=3, d_ff=128, dropout=0.0)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(1)
    model = SentimentClassifier(CFG).eval()
    path = export_encoder_classifier(model, tmp_path_factory.mktemp("onnx") / "model.onnx")
    return model, path


def random_padded_batch(rng, batch, seq):
    ids = rng.integers(4, CFG.vocab_size, size=(batch, seq)).astype(np.int64)
    mask = np.ones_like(ids)
    for row in range(batch):
        length = int(rng.integers(1, seq + 1))
        ids[row, length:] = 0
        mask[row, length:] = 0
    return ids, mask


def test_one_fused_attention_node_per_layer(exported):
    _, path = exported
    ops = count_ops(path)
    assert ops.get("com.microsoft::MultiHeadAttention") == CFG.n_layers
    assert ops.get("com.microsoft::RotaryEmbedding") == 2 * CFG.n_layers  # Q and K
    assert "ai.onnx::Softmax" not in ops  # no decomposed attention softmax


@pytest.mark.parametrize("batch,seq", [(1, 1), (1, 8), (3, 17), (8, 64), (16, 128)])
def test_onnx_matches_pytorch_on_padded_batches(exported, batch, seq):
    model, path = exported
    rng = np.random.default_rng(batch * 1000 + seq)
    ids, mask = random_padded_batch(rng, batch, seq)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
    with torch.no_grad():
        want = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    assert np.abs(got - want).max() <= 1e-4


def test_loads_and_matches_in_ngc_onnxruntime(exported, ngc_ort):
    """The NGC 24.10 image ships ONNX Runtime 1.19.2 (`make test` installs it in .cache/ort-ngc)."""
    model, path = exported
    ids, mask = random_padded_batch(np.random.default_rng(7), 4, 24)
    (logits,) = ngc_ort(path, {"input_ids": ids, "attention_mask": mask}, ["logits"])
    with torch.no_grad():
        want = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    assert np.abs(logits - want).max() <= 1e-4
