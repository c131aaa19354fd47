"""The one-graph generator: BeamSearch over fused-attention subgraphs, equal to the PyTorch reference,
and loadable by the ONNX Runtime inside the NGC Triton image."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

from export.graphs.seq2seq_export import (
    DecoderStep,
    EncoderStep,
    export_generator,
    generate_onnx,
    subgraph_model,
)
from export.model.config import ModelConfig
from export.model.reference_search import ReferenceSearch, beam_search, block_repeated_ngrams, greedy
from export.model.transformer import KVCache, Seq2Seq
from serving.text.tokenizer import strip_generated

pytestmark = pytest.mark.export  # exports and runs ONNX generators: seconds each

SIZES = dict(d_model=32, n_heads=4, n_layers=2, n_decoder_layers=2, d_ff=64, max_len=48)
CFG = ModelConfig(vocab_size=64, tgt_vocab_size=64, **SIZES)
MAX_LEN = 24  # generator cap on max_length (bos + generated tokens)
MS_MHA, ROTARY = "com.microsoft::MultiHeadAttention", "com.microsoft::RotaryEmbedding"


def copy_pairs(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (n,), generator=g).tolist()
    return [torch.randint(4, CFG.vocab_size, (length,), generator=g).tolist() for length in lengths]


def pad(rows: list[list[int]], multiple: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to a multiple of 8, as the front models do; sources end with eos."""
    width = -(-max(len(r) + 1 for r in rows) // multiple) * multiple
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r) + 1] = torch.tensor(r + [CFG.eos_id])
    return ids, (ids != CFG.pad_id).long()


@pytest.fixture(scope="module")
def model():
    """A tiny model that has half-learned to copy 48 sequences (40 full-batch steps): its outputs vary
    with the input and its beams disagree sometimes, unlike an untrained model's."""
    return half_trained(CFG)


def half_trained(cfg: ModelConfig, steps: int = 40) -> Seq2Seq:
    torch.manual_seed(0)
    model = Seq2Seq(cfg)
    seen = copy_pairs(48, seed=1)
    src, src_mask = pad(seen)
    tgt_in = torch.zeros(len(seen), src.shape[1] + 1, dtype=torch.long)
    labels = torch.full_like(tgt_in, -100)
    for i, r in enumerate(seen):
        tgt_in[i, : len(r) + 1] = torch.tensor([CFG.bos_id] + r)
        labels[i, : len(r) + 1] = torch.tensor(r + [CFG.eos_id])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        logits = model(src, src_mask, tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.seen = seen
    return model


@pytest.fixture(scope="module")
def generator(model, tmp_path_factory):
    path = export_generator(model, tmp_path_factory.mktemp("gen") / "generator.onnx", max_len=MAX_LEN)
    return path, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def sources(model):
    """24 padded sources: 12 the model has seen, 12 new ones (where its choices are less certain)."""
    return pad(model.seen[:12] + copy_pairs(12, seed=2))


def counts(graph: onnx.GraphProto) -> dict[str, int]:
    out: dict[str, int] = {}
    for node in graph.node:
        key = f"{node.domain or 'ai.onnx'}::{node.op_type}"
        out[key] = out.get(key, 0) + 1
    return out


def test_generator_is_one_beam_search_over_fused_attention(generator):
    path, session = generator
    proto = onnx.load(str(path))
    assert counts(proto.graph) == {"ai.onnx::Clip": 1, "com.microsoft::BeamSearch": 1}
    assert [i.name for i in session.get_inputs()] == [
        "input_ids",
        "attention_mask",
        "max_length",
        "num_beams",
    ]
    assert [i.type for i in session.get_inputs()] == ["tensor(int32)"] * 4
    assert [o.name for o in session.get_outputs()] == ["sequences"]
    props = session.get_modelmeta().custom_metadata_map
    assert props["eos_id"] == "3" and props["max_len"] == str(MAX_LEN)
    enc, dec = counts(subgraph_model(proto, "encoder").graph), counts(subgraph_model(proto, "decoder").graph)
    # encoder subgraph: encoder self-attention + the first decoder step (self + cross per layer)
    assert enc[MS_MHA] == CFG.n_layers + 2 * CFG.n_decoder_layers
    assert enc[ROTARY] == 2 * (CFG.n_layers + CFG.n_decoder_layers)
    assert dec[MS_MHA] == 2 * CFG.n_decoder_layers and dec[ROTARY] == 2 * CFG.n_decoder_layers
    assert "ai.onnx::Softmax" not in enc and "ai.onnx::Softmax" not in dec


@pytest.mark.parametrize("batch,rows", [(1, [0]), (5, [0, 1, 2, 3, 4]), (3, [5, 12, 20])])
def test_subgraphs_match_pytorch_on_padded_batches(model, generator, sources, batch, rows):
    path, _ = generator
    proto = onnx.load(str(path))
    ids, mask = (t[rows].to(torch.int32) for t in sources)
    start = torch.full((batch, 1), CFG.bos_id, dtype=torch.int32)
    encoder = ort.InferenceSession(subgraph_model(proto, "encoder").SerializeToString())
    got = encoder.run(None, {"encoder_input_ids": ids.numpy(), "encoder_attention_mask": mask.numpy(),
                             "decoder_input_ids": start.numpy()})  # fmt: skip
    with torch.no_grad():
        want = EncoderStep(model)(ids, mask, start)
    assert len(got) == len(want) == 2 + 4 * CFG.n_decoder_layers
    for g, w in zip(got, want, strict=True):
        assert np.abs(g - w.numpy()).max() <= 1e-4

    # the decoder step on top of a real 5-token cache, against the PyTorch KV cache
    cache = KVCache()
    prefix = torch.cat([start.long(), ids[:, :4].long()], dim=1)  # bos + 4 tokens
    nxt = torch.randint(4, CFG.target_vocab_size, (batch, 1), dtype=torch.int32)
    with torch.no_grad():
        memory = model.encode(ids.long(), mask)
        model.decode(prefix, memory, mask, cache)
        past = [t for kv in cache.self_kv + cache.cross_kv for t in kv]
        want = DecoderStep(model)(nxt, mask, *past)
        assert torch.allclose(want[0], model.decode(nxt.long(), memory, mask, cache), atol=1e-6)
    decoder = ort.InferenceSession(subgraph_model(proto, "decoder").SerializeToString())
    names = [i.name for i in decoder.get_inputs()]
    assert names[:3] == ["input_ids", "encoder_attention_mask", "past_key_self_0"]
    feeds = {"input_ids": nxt.numpy(), "encoder_attention_mask": mask.numpy()}
    feeds.update(zip(names[2:], (t.numpy() for t in past), strict=True))
    got = decoder.run(None, feeds)
    for g, w in zip(got, want, strict=True):
        assert np.abs(g - w.numpy()).max() <= 1e-4


def test_greedy_onnx_equals_pytorch_token_for_token(model, generator, sources):
    _, session = generator
    ids, mask = sources
    got = generate_onnx(session, ids.numpy(), mask.numpy(), 16, 1)
    want = greedy(model, ids, mask, 16)
    assert got == want
    assert len({tuple(r) for r in want}) > 12 and any(len(r) > 3 for r in want)  # not degenerate


def test_beam_onnx_agrees_with_pytorch(model, generator, sources):
    _, session = generator
    ids, mask = sources
    got = generate_onnx(session, ids.numpy(), mask.numpy(), 16, 4)
    want = beam_search(model, ids, mask, 16, 4)
    agree = sum(g == w for g, w in zip(got, want, strict=True)) / len(want)
    assert agree >= 0.95, (agree, got, want)
    differs_from_greedy = sum(b != g for b, g in zip(want, greedy(model, ids, mask, 16), strict=True))
    assert differs_from_greedy >= len(want) // 4  # the beams matter on this model


def test_max_length_counts_the_start_token_and_is_clamped(generator, sources):
    _, session = generator
    ids, mask = (t[:2].numpy().astype(np.int32) for t in sources)

    def run(max_length):
        feeds = {"input_ids": ids, "attention_mask": mask, "max_length": np.array([max_length], np.int32),
                 "num_beams": np.array([1], np.int32)}  # fmt: skip
        return session.run(["sequences"], feeds)[0]

    assert run(6).shape == (2, 1, 6)  # bos + at most 5 tokens
    assert (run(6)[:, 0, 0] == CFG.bos_id).all()
    assert run(1).shape == (2, 1, 3)  # ORT's T5 loop needs max_length >= 3
    assert run(1000).shape == (2, 1, MAX_LEN)
    assert strip_generated([2, 7, 8, 3, 0], 2, 3, 0) == [7, 8] and strip_generated([2, 7, 0, 0], 2, 3, 0) == [7]


def test_generator_loads_and_generates_identically_in_ngc_onnxruntime(generator, sources, ngc_ort):
    """The NGC 24.10 image ships ONNX Runtime 1.19.2 (`make test` installs it in .cache/ort-ngc)."""
    path, session = generator
    ids, mask = (t.numpy().astype(np.int32) for t in sources)
    for beams in (1, 4):
        feeds = {"input_ids": ids, "attention_mask": mask, "max_length": np.array([17], np.int32),
                 "num_beams": np.array([beams], np.int32)}  # fmt: skip
        (got,) = ngc_ort(path, feeds, ["sequences"])
        assert got.tolist() == session.run(["sequences"], feeds)[0].tolist()


@pytest.fixture(scope="module")
def copying(tmp_path_factory):
    """A pointer-generator model (cfg.copy) half-trained on the same copies, and its generator session."""
    model = half_trained(ModelConfig(vocab_size=64, copy=True, **SIZES))
    path = export_generator(model, tmp_path_factory.mktemp("copy") / "generator.onnx", max_len=MAX_LEN)
    return model, path, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_copying_generator_carries_the_pointer_as_one_more_cache_pair(copying):
    _, path, _ = copying
    proto = onnx.load(str(path))
    n = CFG.n_decoder_layers + 1
    enc, dec = subgraph_model(proto, "encoder"), subgraph_model(proto, "decoder")
    assert [o.name for o in enc.graph.output][-2:] == [f"present_key_cross_{n - 1}", f"present_value_cross_{n - 1}"]
    assert len(dec.graph.input) == 2 + 4 * n and len(dec.graph.output) == 1 + 2 * n
    # the decoder layers keep their fused attention; the pointer's weights are a plain Softmax (it needs them)
    assert counts(dec.graph)[MS_MHA] == 2 * CFG.n_decoder_layers and counts(dec.graph)["ai.onnx::Softmax"] == 2


def test_copying_generator_equals_pytorch(copying, model, sources, ngc_ort):
    copier, path, session = copying
    ids, mask = sources
    for beams in (1, 4):
        got = generate_onnx(session, ids.numpy(), mask.numpy(), 16, beams)
        want = greedy(copier, ids, mask, 16) if beams == 1 else beam_search(copier, ids, mask, 16, 4)
        assert sum(g == w for g, w in zip(got, want, strict=True)) >= 0.95 * len(want), (beams, got, want)
        feeds = {"input_ids": ids.numpy().astype(np.int32), "attention_mask": mask.numpy().astype(np.int32),
                 "max_length": np.array([17], np.int32), "num_beams": np.array([beams], np.int32)}  # fmt: skip
        (ngc,) = ngc_ort(path, feeds, ["sequences"])
        assert ngc.tolist() == session.run(["sequences"], feeds)[0].tolist()

    # with the same 40 steps the pointer has learnt the copy task better (measured: 8 of 12 seen sources
    # come back whole, 3 without the pointer)
    def whole(m: Seq2Seq) -> int:
        return sum(out == src for out, src in zip(greedy(m, ids[:12], mask[:12], 16), m.seen[:12], strict=True))

    assert whole(copier) > whole(model)


def test_length_penalty_is_exported_and_matches_the_reference(model, sources, tmp_path):
    path = export_generator(model, tmp_path / "generator.onnx", max_len=MAX_LEN, length_penalty=2.0)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.get_modelmeta().custom_metadata_map["length_penalty"] == "2.0"
    ids, mask = sources
    got = generate_onnx(session, ids.numpy(), mask.numpy(), 16, 4)
    want = beam_search(model, ids, mask, 16, 4, length_penalty=2.0)
    assert sum(g == w for g, w in zip(got, want, strict=True)) >= 0.95 * len(want)
    # longer outputs win more often than with the default penalty of 1
    default = beam_search(model, ids, mask, 16, 4)
    assert sum(map(len, want)) >= sum(map(len, default))


def test_block_repeated_ngrams_follows_orts_processor():
    scores = torch.zeros(3, 10)
    sequences = [[2, 5, 6, 5], [2, 5, 6, 7], [2]]
    block_repeated_ngrams(scores, sequences, 2)
    lowest = torch.finfo(torch.float32).min
    assert scores[0].tolist() == [0.0] * 6 + [lowest] + [0.0] * 3, "5 → 6 was seen: 6 may not follow 5 again"
    assert (scores[1:] == 0).all(), "no repeat possible; a sequence shorter than n is left alone"
    block_repeated_ngrams(scores, [[2, 5, 6, 5]], 1)
    assert set((scores[0] == lowest).nonzero().flatten().tolist()) == {2, 5, 6}, "n = 1: no token twice (bos too)"


@pytest.mark.parametrize("n", [1, 2])
def test_no_repeat_ngram_size_is_exported_and_matches_the_reference(model, sources, tmp_path, n):
    path = export_generator(model, tmp_path / "generator.onnx", max_len=MAX_LEN, no_repeat_ngram_size=n)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.get_modelmeta().custom_metadata_map["no_repeat_ngram_size"] == str(n)
    ids, mask = sources
    decoding = ReferenceSearch(no_repeat_ngram_size=n)
    for beams in (1, 4):
        got = generate_onnx(session, ids.numpy(), mask.numpy(), 16, beams)
        want = decoding.generate(model, ids, mask, 16, beams)
        assert sum(g == w for g, w in zip(got, want, strict=True)) >= (1.0 if beams == 1 else 0.95) * len(want)
        for out in want:
            ngrams = [tuple(out[i : i + n]) for i in range(len(out) - n + 1)]
            assert len(set(ngrams)) == len(ngrams), out
    # the setting decides something here: without it some outputs repeat
    assert ReferenceSearch().generate(model, ids, mask, 16, 1) != decoding.generate(model, ids, mask, 16, 1)
