"""Explain models: the explicit attention is the same model as the fast one, its probabilities are
distributions, the ONNX files agree with PyTorch (also in the NGC image's ONNX Runtime), and the
front-model helpers pad and roll out correctly."""

import numpy as np
import onnxruntime as ort
import pytest
import torch

from export.graphs.explain_export import (
    SentimentExplainer,
    TranslateExplainer,
    export_sentiment_explainer,
    export_translate_explainer,
)
from export.graphs.onnx_export import count_ops
from export.model.attention import AttentionRecord
from export.model.config import ModelConfig
from export.model.reference_search import greedy
from export.model.transformer import SentimentClassifier, Seq2Seq
from serving.frontends.explain import (
    attention_rollout,
    decoder_inputs,
    pad_arrays,
    pad_tokens,
    pooled_rollout,
    target_rows,
)

pytestmark = pytest.mark.export  # exports and runs ONNX models: seconds each

ENC_CFG = ModelConfig(vocab_size=300, d_model=64, n_heads=4, n_layers=3, d_ff=128, dropout=0.0)
S2S_CFG = ModelConfig(vocab_size=80, tgt_vocab_size=90, d_model=32, n_heads=4, n_layers=2, n_decoder_layers=2, d_ff=64)


def padded(batch: int, seq: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (batch, seq), generator=g)
    lengths = torch.randint(1, seq + 1, (batch,), generator=g)
    lengths[0] = seq  # one full row, so the batch is as wide as its longest text
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    return ids * mask, mask


@pytest.fixture(scope="module")
def classifier():
    torch.manual_seed(3)
    return SentimentClassifier(ENC_CFG).eval()


@pytest.fixture(scope="module")
def seq2seq():
    torch.manual_seed(4)
    return Seq2Seq(S2S_CFG).eval()


def test_explicit_attention_is_the_same_classifier(classifier):
    ids, mask = padded(5, 19, ENC_CFG.vocab_size, seed=1)
    with torch.no_grad():
        want = classifier(ids, mask)
        logits, attention = SentimentExplainer(classifier)(ids, mask)
    assert torch.allclose(logits, want, atol=1e-5)
    assert attention.shape == (5, ENC_CFG.n_layers, 19, 19)
    real_rows = attention.sum(-1)[mask[:, None, :].expand(-1, ENC_CFG.n_layers, -1).bool()]
    assert torch.allclose(real_rows, torch.ones_like(real_rows), atol=1e-5)
    padded_keys = attention * (1 - mask)[:, None, None, :]
    assert padded_keys.abs().max() == 0  # nothing attends to padding
    padded_rows = attention * (1 - mask)[:, None, :, None]
    assert padded_rows.abs().max() == 0


def test_explicit_attention_is_the_same_seq2seq(seq2seq):
    src, src_mask = padded(4, 11, S2S_CFG.vocab_size, seed=2)
    tgt = torch.randint(4, S2S_CFG.target_vocab_size, (4, 6))
    tgt[:, 0] = S2S_CFG.bos_id
    with torch.no_grad():
        want = seq2seq(src, src_mask, tgt)
        logits, cross = TranslateExplainer(seq2seq)(src.int(), src_mask.int(), tgt.int())
    assert torch.allclose(logits, want, atol=1e-5)
    assert cross.shape == (4, S2S_CFG.n_decoder_layers, 6, 11)
    assert torch.allclose(cross.sum(-1), torch.ones(4, S2S_CFG.n_decoder_layers, 6), atol=1e-5)
    assert (cross * (1 - src_mask)[:, None, None, :]).abs().max() == 0


def test_teacher_forcing_reproduces_greedy_generation(seq2seq):
    """Re-reading a greedy output with teacher forcing predicts the same tokens: the alignment belongs
    to the translation that was served."""
    src, src_mask = padded(3, 9, S2S_CFG.vocab_size, seed=5)
    with torch.no_grad():
        generated = greedy(seq2seq, src, src_mask, max_new_tokens=8)
        targets = target_rows(generated, new_tokens=8)
        dec = torch.from_numpy(decoder_inputs(targets))
        logits, _ = TranslateExplainer(seq2seq)(src.int(), src_mask.int(), dec)
    for row, target in enumerate(targets):
        assert logits[row, : len(target)].argmax(-1).tolist() == target


def test_records_every_layer_and_leaves_the_model_as_it_was(seq2seq):
    implementations = [m.attn_implementation for m in seq2seq.modules() if hasattr(m, "attn_implementation")]
    src, src_mask = padded(2, 5, S2S_CFG.vocab_size, seed=3)
    record = AttentionRecord()
    with torch.no_grad():
        seq2seq(src, src_mask, torch.full((2, 3), S2S_CFG.bos_id), record)
    assert (len(record.encoder), len(record.decoder), len(record.cross)) == (2, 2, 2)
    causal = record.decoder[0]  # [B, H, T, T]: nothing above the diagonal
    assert torch.triu(causal, diagonal=1).abs().max() == 0
    assert implementations == ["sdpa"] * 6  # encoder self, decoder self and cross per layer
    assert [m.attn_implementation for m in seq2seq.modules() if hasattr(m, "attn_implementation")] == implementations


@pytest.fixture(scope="module")
def sentiment_onnx(classifier, tmp_path_factory):
    return export_sentiment_explainer(classifier, tmp_path_factory.mktemp("explain") / "sentiment.onnx")


@pytest.fixture(scope="module")
def translate_onnx(seq2seq, tmp_path_factory):
    return export_translate_explainer(seq2seq, tmp_path_factory.mktemp("explain") / "translate.onnx")


def test_sentiment_onnx_matches_pytorch(classifier, sentiment_onnx):
    ops = count_ops(sentiment_onnx)
    assert ops["ai.onnx::Softmax"] == ENC_CFG.n_layers and "com.microsoft::MultiHeadAttention" not in ops
    ids, mask = padded(3, 21, ENC_CFG.vocab_size, seed=8)
    session = ort.InferenceSession(str(sentiment_onnx), providers=["CPUExecutionProvider"])
    logits, attention = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        want_logits, want_attention = SentimentExplainer(classifier)(ids, mask)
    assert np.abs(logits - want_logits.numpy()).max() <= 1e-4
    assert np.abs(attention - want_attention.numpy()).max() <= 1e-5


def translate_feeds(seed: int) -> dict[str, np.ndarray]:
    src, src_mask = padded(3, 10, S2S_CFG.vocab_size, seed=seed)
    dec = torch.randint(4, S2S_CFG.target_vocab_size, (3, 7))
    dec[:, 0] = S2S_CFG.bos_id
    return {
        "input_ids": src.int().numpy(),
        "attention_mask": src_mask.int().numpy(),
        "decoder_input_ids": dec.int().numpy(),
    }


def test_translate_onnx_matches_pytorch(seq2seq, translate_onnx):
    feeds = translate_feeds(seed=9)
    session = ort.InferenceSession(str(translate_onnx), providers=["CPUExecutionProvider"])
    logits, cross = session.run(None, feeds)
    with torch.no_grad():
        want_logits, want_cross = TranslateExplainer(seq2seq)(*(torch.from_numpy(a) for a in feeds.values()))
    assert np.abs(logits - want_logits.numpy()).max() <= 1e-4
    assert np.abs(cross - want_cross.numpy()).max() <= 1e-5


def test_explain_onnx_loads_in_ngc_onnxruntime(seq2seq, classifier, sentiment_onnx, translate_onnx, ngc_ort):
    """The NGC 24.10 image ships ONNX Runtime 1.19.2."""
    feeds = translate_feeds(seed=10)
    (cross,) = ngc_ort(translate_onnx, feeds, ["cross_attention"])
    with torch.no_grad():
        _, want = TranslateExplainer(seq2seq)(*(torch.from_numpy(a) for a in feeds.values()))
    assert np.abs(cross - want.numpy()).max() <= 1e-5
    ids, mask = padded(2, 13, ENC_CFG.vocab_size, seed=11)
    (attention,) = ngc_ort(sentiment_onnx, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}, ["attention"])
    with torch.no_grad():
        _, want = SentimentExplainer(classifier)(ids, mask)
    assert np.abs(attention - want.numpy()).max() <= 1e-5


# -- front-model helpers (no server) ----------------------------------------------------------


def test_rollout_rows_are_distributions_and_residual_keeps_the_diagonal():
    rng = np.random.default_rng(0)
    layers = rng.random((3, 5, 5))
    layers /= layers.sum(-1, keepdims=True)
    rollout = attention_rollout(layers)
    assert np.allclose(rollout.sum(-1), 1.0)
    assert np.isclose(pooled_rollout(layers).sum(), 1.0, atol=1e-6)
    uniform = np.full((2, 4, 4), 0.25)  # attention that ignores position: only the residual path stands out
    assert np.allclose(np.diag(attention_rollout(uniform)), 0.25 + 0.75 * 0.25)


def test_padding_of_per_text_outputs():
    tokens = pad_tokens([["我", "爱"], ["你"]])
    assert tokens.tolist() == [["我".encode(), "爱".encode()], ["你".encode(), b""]]
    matrices = pad_arrays([np.ones((2, 2, 3)), np.ones((2, 1, 1))])
    assert matrices.shape == (2, 2, 2, 3) and matrices.dtype == np.float32
    assert matrices[1].sum() == 2 and matrices[1, :, 0, 0].tolist() == [1, 1]


def test_targets_end_with_eos_only_when_the_model_stopped():
    targets = target_rows([[7, 8], [5, 6, 9]], new_tokens=3)
    assert targets == [[7, 8, 3], [5, 6, 9]]  # the second was cut by MAX_NEW_TOKENS
    assert decoder_inputs(targets).tolist() == [[2, 7, 8], [2, 5, 6]]
