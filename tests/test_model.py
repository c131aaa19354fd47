"""The model's building blocks do what the seed documents say they do."""

import math

import pytest
import torch

from export.model.attention import AttentionRecord, attention, set_attention, using_attention
from export.model.config import ModelConfig
from export.model.positional import apply_rope, rope_tables
from export.model.transformer import SentimentClassifier

torch.manual_seed(0)


def test_rope_scores_depend_only_on_relative_offset():
    dh, n = 16, 64
    cos, sin = rope_tables(n, dh)
    q, k = torch.randn(1, 1, dh), torch.randn(1, 1, dh)

    def score(i: int, j: int) -> float:
        qi = apply_rope(q, cos, sin, offset=i)
        kj = apply_rope(k, cos, sin, offset=j)
        return float((qi * kj).sum())

    for offset in (0, 1, 5, 17):
        scores = [score(i + offset, i) for i in range(0, 40, 7)]
        assert max(scores) - min(scores) < 1e-4, (offset, scores)
    # ...and the offset does matter
    assert abs(score(3, 0) - score(10, 0)) > 1e-3


def test_rope_preserves_norm():
    cos, sin = rope_tables(32, 8)
    x = torch.randn(2, 32, 8 * 3)
    assert torch.allclose(apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1), atol=1e-5)


def naive_attention(q, k, v, mask, n_heads):
    b, s, d = q.shape
    dh = d // n_heads
    q = q.view(b, s, n_heads, dh).transpose(1, 2)
    k = k.view(b, -1, n_heads, dh).transpose(1, 2)
    v = v.view(b, -1, n_heads, dh).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
    scores = scores.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)


@pytest.mark.parametrize("impl", ["sdpa", "explicit"])
@pytest.mark.parametrize("b,s,t,h", [(1, 5, 5, 1), (3, 7, 7, 4), (2, 4, 9, 2)])
def test_attention_equals_naive_softmax_qkv(impl, b, s, t, h):
    q, k, v = torch.randn(b, s, 32), torch.randn(b, t, 32), torch.randn(b, t, 32)
    mask = torch.ones(b, t, dtype=torch.int64)
    mask[-1, t // 2 :] = 0
    got, _, probs = attention(q, k, v, impl, h, key_padding_mask=mask)
    assert torch.allclose(got, naive_attention(q, k, v, mask, h), atol=1e-5)
    if impl == "explicit":  # [B, H, S, T] distributions that skip padding
        assert probs.shape == (b, h, s, t)
        assert torch.allclose(probs.sum(-1), torch.ones(b, h, s), atol=1e-5)
        assert probs[-1, ..., t // 2 :].abs().max() == 0


def small_classifier() -> tuple[SentimentClassifier, torch.Tensor, torch.Tensor]:
    cfg = ModelConfig(vocab_size=100, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0)
    ids = torch.randint(4, 100, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return SentimentClassifier(cfg).eval(), ids, mask


@torch.no_grad()
def test_implementations_are_one_model_and_a_record_gets_every_layer():
    model, ids, mask = small_classifier()
    want = model(ids, mask)
    record = AttentionRecord()
    assert torch.allclose(model(ids, mask, record), want, atol=1e-5)
    assert [p.shape for p in record.encoder] == [(2, 4, 9, 9)] * 2
    assert all(layer.attn.attn_implementation == "sdpa" for layer in model.encoder.blocks)  # a record sets nothing
    assert torch.allclose(set_attention(model, "explicit")(ids, mask), want, atol=1e-5)


def test_fused_attention_exists_only_in_an_export():
    model, ids, mask = small_classifier()
    with using_attention(model, "ort_fused"), pytest.raises(RuntimeError, match="exported ONNX graph"):
        model(ids, mask)
    assert {block.attn.attn_implementation for block in model.encoder.blocks} == {"sdpa"}  # restored
    with pytest.raises(ValueError, match="not one of"):
        set_attention(model, "flash")


def test_padding_does_not_change_unpadded_outputs():
    cfg = ModelConfig(vocab_size=100, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0)
    model = SentimentClassifier(cfg).eval()
    ids = torch.randint(4, 100, (1, 9))
    alone = model(ids, torch.ones_like(ids))
    padded_ids = torch.cat([ids, torch.zeros(1, 7, dtype=torch.int64)], dim=1)
    padded_mask = torch.cat([torch.ones(1, 9), torch.zeros(1, 7)], dim=1).long()
    assert torch.allclose(alone, model(padded_ids, padded_mask), atol=1e-5)
    # hidden states of the real tokens too
    h_alone = model.encoder(ids, torch.ones_like(ids))
    h_padded = model.encoder(padded_ids, padded_mask)[:, :9]
    assert torch.allclose(h_alone, h_padded, atol=1e-5)


def test_config_rejects_bad_head_split():
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(d_model=30, n_heads=4)
