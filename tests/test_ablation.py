"""The four positional schemes do what the seed documents say, and `python -m export.evaluation.ablation` writes its
report."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from export.evaluation.ablation import IGNORE, NOT, POSITIVE, main, negation_example, order_example
from export.model.checkpoint import read_json
from export.model.config import POSITIONAL_SCHEMES, ModelConfig
from export.model.positional import RelativePositionBias, apply_rope, sinusoidal_table
from export.model.transformer import Encoder, SentimentClassifier, Seq2Seq

SMALL = dict(vocab_size=50, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=64, dropout=0.0)
CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"


@pytest.mark.parametrize("scheme", POSITIONAL_SCHEMES)
def test_each_scheme_ignores_padding(scheme):
    torch.manual_seed(0)
    model = SentimentClassifier(ModelConfig(**SMALL, positional=scheme)).eval()
    if scheme == "relative_bias":  # starts at zero: give the buckets values so they take part
        torch.nn.init.normal_(model.encoder.rel_bias.bias)
    for block in model.encoder.blocks:  # peaked attention, so that where a token sits shows in the states
        torch.nn.init.normal_(block.attn.qkv.weight, std=0.5)
    ids = torch.randint(4, 50, (1, 9))
    padded_ids = torch.cat([ids, torch.zeros(1, 7, dtype=torch.int64)], dim=1)
    padded_mask = torch.cat([torch.ones(1, 9), torch.zeros(1, 7)], dim=1).long()
    alone = model.encoder(ids, torch.ones_like(ids))
    assert torch.allclose(alone, model.encoder(padded_ids, padded_mask)[:, :9], atol=1e-5)
    # ...and positions matter: the same tokens in another order give other states
    flipped = model.encoder(ids.flip(1), torch.ones_like(ids))
    assert (alone[:, 0] - flipped[:, -1]).abs().max() > 1e-2


def test_sinusoidal_table_is_the_seed_formula():
    d = 16
    pe = sinusoidal_table(50, d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            assert pe[pos, 2 * i] == pytest.approx(math.sin(pos / 10000 ** (2 * i / d)), abs=1e-6)
            assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(pos / 10000 ** (2 * i / d)), abs=1e-6)


def test_relative_bias_depends_only_on_i_minus_j():
    bias_module = RelativePositionBias(ModelConfig(**SMALL, positional="relative_bias"))
    torch.nn.init.normal_(bias_module.bias)
    bias = bias_module(40)[0]  # [H, S, S]
    for shift in (1, 5, 13):
        assert torch.equal(bias[:, shift:, shift:], bias[:, :-shift, :-shift])
    assert not torch.equal(bias[:, 5, 3], bias[:, 3, 5])  # direction matters: a_{2} ≠ a_{-2}
    # distances past max_distance share the last bucket of their direction
    far = RelativePositionBias(ModelConfig(**SMALL, positional="relative_bias", relative_max_distance=16))
    torch.nn.init.normal_(far.bias)
    b = far(40)[0]
    assert torch.equal(b[:, 39, 0], b[:, 39, 20]) and torch.equal(b[:, 0, 39], b[:, 20, 39])


def test_rope_scores_in_the_encoder_depend_only_on_i_minus_j():
    enc = Encoder(ModelConfig(**SMALL))
    q, k = torch.randn(1, 1, 32), torch.randn(1, 1, 32)

    def score(i: int, j: int) -> float:
        rotated_q = apply_rope(q, enc.rope_cos, enc.rope_sin, offset=i)
        return float((rotated_q * apply_rope(k, enc.rope_cos, enc.rope_sin, offset=j)).sum())

    for i, j in ((3, 1), (10, 20), (0, 30)):
        assert score(i, j) == pytest.approx(score(i + 17, j + 17), abs=1e-4)
    assert abs(score(3, 1) - score(1, 3)) > 1e-4


def test_default_scheme_is_rope_and_loads_the_shipped_checkpoint_strictly():
    config = read_json(CHECKPOINTS / "sentiment" / "config.json")["model"]
    assert config.get("positional", "rope") == "rope"
    older = {k: v for k, v in config.items() if not k.startswith(("positional", "relative_"))}
    assert ModelConfig.from_dict(older).positional == "rope"  # configs written before the ablation load as RoPE
    cfg = ModelConfig.from_dict(config)
    assert cfg.positional == "rope"
    model = SentimentClassifier(cfg)
    model.load_state_dict(load_file(CHECKPOINTS / "sentiment" / "model.safetensors"), strict=True)


def test_unsupported_combinations_raise_clear_errors():
    with pytest.raises(ValueError, match="positional='alibi' is not one of"):
        ModelConfig(positional="alibi")
    with pytest.raises(ValueError, match="Seq2Seq supports positional='rope' only"):
        Seq2Seq(ModelConfig(**SMALL, n_decoder_layers=1, positional="learned"))
    with pytest.raises(ValueError, match="longer than max_len=64"):
        Encoder(ModelConfig(**SMALL, positional="learned"))(torch.ones(1, 65, dtype=torch.long), torch.ones(1, 65))


def test_tasks_depend_on_order():
    import random

    rng = random.Random(0)
    ids, tags = negation_example(rng, 200)
    tagged = [i for i, t in enumerate(tags) if t != IGNORE]
    flipped = [i for i in tagged if i > 0 and ids[i - 1] == NOT]
    assert 0.3 < len(flipped) / len(tagged) < 0.7  # half the polar words are negated: position-blind scores ~50%
    assert all(tags[i] == int(ids[i] not in POSITIVE) for i in flipped)
    ids, tags = order_example(rng, 30)
    a = [i for i, t in enumerate(tags) if t != IGNORE]
    assert len(a) == 1 and tags[a[0]] == int(ids.index(3) > a[0])


def test_quick_ablation_writes_table_plot_and_accuracy_per_length(tmp_path):
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    lengths = {str(n) for n in results["config"]["eval_lengths"]}
    for task in results["config"]["tasks"]:
        assert set(results["summary"][task]) == set(POSITIONAL_SCHEMES)
        for scheme, per_length in results["summary"][task].items():
            assert set(per_length) == lengths, (task, scheme)
            assert all(0.0 <= s["mean"] <= 1.0 for s in per_length.values())
    assert all(run["steps"] == results["config"]["steps"] for run in results["runs"])
    table = (tmp_path / "table.md").read_text()
    assert all(f"| {scheme} |" in table for scheme in POSITIONAL_SCHEMES)
    png = (tmp_path / "accuracy_vs_length.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (1100, 400)  # two task panels of 5.5 x 4 inches at 100 dpi


@pytest.mark.parametrize("scheme", ["sinusoidal", "learned", "relative_bias"])
def test_non_rope_schemes_export_fused_and_match_pytorch(scheme, tmp_path, ngc_ort):
    """One MultiHeadAttention node per layer (relative_bias through its attention_bias input), no RotaryEmbedding;
    same logits in ONNX Runtime 1.31 and in the NGC image's 1.19."""
    import numpy as np
    import onnxruntime as ort

    from export.graphs.onnx_export import count_ops, export_encoder_classifier

    torch.manual_seed(2)
    model = SentimentClassifier(ModelConfig(**{**SMALL, "n_layers": 1}, positional=scheme)).eval()
    if scheme == "relative_bias":
        torch.nn.init.normal_(model.encoder.rel_bias.bias)
    path = export_encoder_classifier(model, tmp_path / "model.onnx")
    ops = count_ops(path)
    assert ops.get("com.microsoft::MultiHeadAttention") == 1 and "com.microsoft::RotaryEmbedding" not in ops
    ids = torch.randint(4, 50, (3, 40))
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    with torch.no_grad():
        want = model(ids, mask).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert np.abs(session.run(["logits"], feeds)[0] - want).max() <= 1e-4
    assert np.abs(ngc_ort(path, feeds, ["logits"])[0] - want).max() <= 2e-4
