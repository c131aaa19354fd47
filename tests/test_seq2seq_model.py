"""The encoder-decoder is causal, its KV cache is exact, and padding and cross-attention behave."""

import math

import pytest
import torch

from export.model.attention import attention, split_heads, using_attention
from export.model.config import ModelConfig
from export.model.transformer import CrossAttention, KVCache, Seq2Seq

SIZES = dict(d_model=32, n_heads=4, n_layers=2, n_decoder_layers=2, d_ff=64, dropout=0.0)
CFG = ModelConfig(vocab_size=120, tgt_vocab_size=90, **SIZES)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Seq2Seq(CFG).eval()


def batch(b=3, s=9, t=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, CFG.vocab_size, (b, s), generator=g)
    mask = torch.ones_like(src)
    mask[-1, s // 2 :] = 0  # one padded row
    src = src.masked_fill(mask == 0, CFG.pad_id)
    tgt = torch.randint(4, CFG.target_vocab_size, (b, t), generator=g)
    tgt[:, 0] = CFG.bos_id
    return src, mask, tgt


@torch.no_grad()
def test_later_target_tokens_do_not_change_earlier_logits(model):
    src, mask, tgt = batch()
    changed = tgt.clone()
    changed[:, 4:] = (changed[:, 4:] + 7) % CFG.target_vocab_size
    a, b = model(src, mask, tgt), model(src, mask, changed)
    assert a.shape == (3, 7, CFG.target_vocab_size)
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-6)
    assert not torch.allclose(a[:, 4:], b[:, 4:], atol=1e-3)


@torch.no_grad()
@pytest.mark.parametrize("chunks", [[1] * 7, [3, 1, 3], [2, 5]])
def test_cached_decoding_equals_teacher_forcing(model, chunks):
    src, mask, tgt = batch()
    full = model(src, mask, tgt)
    memory = model.encode(src, mask)
    cache = KVCache()
    steps, start = [], 0
    for n in chunks:  # one token at a time, or several new positions on top of a cache
        steps.append(model.decode(tgt[:, start : start + n], memory, mask, cache))
        start += n
        assert cache.length == start
    assert cache.self_kv[0][0].shape == (3, CFG.n_heads, 7, CFG.head_dim)  # BNSH
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


@torch.no_grad()
def test_cache_reorder_follows_rows(model):
    src, mask, tgt = batch()
    memory = model.encode(src, mask)
    cache = KVCache()
    model.decode(tgt[:, :3], memory, mask, cache)
    rows = torch.tensor([2, 2, 0])
    cache.reorder(rows)
    step = model.decode(tgt[rows, 3:4], memory[rows], mask[rows], cache)
    want = model(src[rows], mask[rows], tgt[rows, :4])[:, 3:4]
    assert torch.allclose(step, want, atol=1e-5)


@torch.no_grad()
def test_source_padding_does_not_change_outputs(model):
    src, mask, tgt = batch(b=1, s=6)
    alone = model(src, mask, tgt)
    padded_src = torch.cat([src, torch.zeros(1, 10, dtype=torch.int64)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(1, 10, dtype=torch.int64)], dim=1)
    assert torch.allclose(alone, model(padded_src, padded_mask, tgt), atol=1e-5)


def naive_cross_attention(attn: CrossAttention, x, memory, mask):
    h = attn.n_heads
    q = split_heads(attn.q(x), h)  # [B, H, T, Dh]
    k, v = (split_heads(t, h) for t in attn.kv(memory).chunk(2, dim=-1))  # [B, H, S, Dh]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2)
    return attn.out(out)


@torch.no_grad()
@pytest.mark.parametrize("impl", ["sdpa", "explicit"])
def test_cross_attention_equals_naive_softmax(model, impl):
    attn = model.decoder.blocks[0].cross_attn
    x, memory = torch.randn(3, 5, CFG.d_model), torch.randn(3, 9, CFG.d_model)
    mask = torch.ones(3, 9, dtype=torch.int64)
    mask[1, 4:] = 0
    with using_attention(attn, impl):
        got = attn(x, attn.project_memory(memory), mask)
    assert torch.allclose(got, naive_cross_attention(attn, x, memory, mask), atol=1e-5)


@pytest.mark.parametrize("impl", ["sdpa", "explicit"])
@pytest.mark.parametrize("t", [1, 3])
def test_causal_attention_equals_naive_masked_softmax(impl, t):
    h, p, d = 2, 4, 16
    q, k, v = torch.randn(2, t, d), torch.randn(2, t, d), torch.randn(2, t, d)
    past = torch.randn(2, h, p, d // h), torch.randn(2, h, p, d // h)
    out, (pk, pv), probs = attention(q, k, v, impl, h, causal=True, past=past)
    assert pk.shape == pv.shape == (2, h, p + t, d // h)
    scores = split_heads(q, h) @ pk.transpose(-1, -2) / math.sqrt(d // h)  # [B, H, T, P+T]
    future = torch.arange(p + t)[None, :] > (p + torch.arange(t))[:, None]
    want_probs = scores.masked_fill(future, float("-inf")).softmax(-1)
    assert torch.allclose(out, (want_probs @ pv).transpose(1, 2).flatten(2), atol=1e-5)
    if impl == "explicit":
        assert torch.allclose(probs, want_probs, atol=1e-6)
    else:
        assert probs is None


def test_config_defaults_are_encoder_only_and_old_configs_load():
    old = {"vocab_size": 500, "d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 128, "num_labels": 2}
    cfg = ModelConfig.from_dict(old)
    assert cfg.n_decoder_layers == 0 and cfg.target_vocab_size == 500
    assert (cfg.pad_id, cfg.bos_id, cfg.eos_id) == (0, 2, 3)
    assert ModelConfig.from_dict(CFG.to_dict()) == CFG
    with pytest.raises(ValueError, match="n_decoder_layers"):
        Seq2Seq(cfg)


def test_state_dict_keys_are_stable():
    keys = set(Seq2Seq(CFG).state_dict())
    assert "decoder.embed.weight" in keys and not any("rope" in k for k in keys)
    expected = {
        "encoder.embed.weight",
        "decoder.blocks.1.cross_attn.kv.weight",
        "decoder.blocks.0.attn.qkv.bias",
    }
    assert expected <= keys
    assert not any(k.startswith("head") for k in keys)  # output projection tied to decoder.embed
