"""The engine's int8 step graphs (export/graphs/step_export.py: quantize_step_graphs) from the shipped translate
checkpoint: the fused attention and rotary nodes survive quantization, nothing on the RoPE path is quantized, the
graphs load in the served image's onnxruntime too, and greedy int8 decoding mostly gives the fp32 tokens.

The quality change on the whole test sets is measured by `python -m benchmarks.engine_int8`
(benchmarks/results/engine_int8.json)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_generation_parity import SENTENCES  # everyday sentences: no dataset needed

from export.graphs.step_export import export_step_graphs, quantize_step_graphs, rope_path_nodes
from export.training import seq2seq
from serving.engine.config import EngineConfig
from serving.engine.engine import Engine, Job

pytestmark = pytest.mark.export

ROOT = Path(__file__).resolve().parents[1]
FUSED = ("com.microsoft::MultiHeadAttention", "com.microsoft::RotaryEmbedding")
QUANTIZED_OPS = {"MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "QuantizeLinear"}
# Greedy int8 tokens identical to fp32 on the built-in sentences: 0.95 observed (38/40); on the whole Tatoeba
# test set 0.88, with BLEU/chrF within 0.1 (benchmarks/results/engine_int8.json).
AGREEMENT_FLOOR = 0.8


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("step_int8")
    model, config, src_tok, _ = seq2seq.load(ROOT / "checkpoints" / "translate")
    fp32 = export_step_graphs(model, folder)
    int8 = quantize_step_graphs(folder)
    return model, config, src_tok, fp32, int8


def ops(proto: onnx.ModelProto) -> Counter:
    return Counter(f"{node.domain}::{node.op_type}" for node in proto.graph.node)


def test_int8_graphs_keep_fused_nodes_and_a_float_rope_path(graphs):
    _, _, _, fp32, int8 = graphs
    assert [p.name for p in int8] == ["encoder.int8.onnx", "decoder.int8.onnx"]
    assert all(p.parent == f.parent for p, f in zip(int8, fp32))  # next to the float graphs
    for float_path, int8_path in zip(fp32, int8):
        before, after = onnx.load(str(float_path)), onnx.load(str(int8_path))
        onnx.checker.check_model(after)
        for op in FUSED:
            assert ops(after)[op] == ops(before)[op] > 0, (int8_path.name, op)
        fused = [n for n in after.graph.node if f"{n.domain}::{n.op_type}" in FUSED]
        originals = {n.name: n for n in before.graph.node}
        assert all(n.attribute == originals[n.name].attribute for n in fused)  # same settings
        assert ops(after)["::MatMulInteger"] > 0  # something was quantized
        # the RoPE path of the quantized graph: the same nodes, none of them quantized, tables still float
        on_path = set(rope_path_nodes(after))
        assert on_path == set(rope_path_nodes(before))
        assert not [n.name for n in after.graph.node if n.name in on_path and n.op_type in QUANTIZED_OPS]
        tables = [t for t in after.graph.initializer if "rope_" in t.name]
        assert tables and all(t.data_type == onnx.TensorProto.FLOAT for t in tables)


def test_int8_encoder_runs_alike_in_the_served_image_onnxruntime(graphs, ngc_ort):
    """The NGC image's onnxruntime 1.19.2 loads the int8 graphs and computes what this one does."""
    import onnxruntime as ort

    _, _, _, _, (encoder, decoder) = graphs
    ids = np.array([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]], np.int32)
    feeds = {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int32)}
    session = ort.InferenceSession(str(encoder), providers=["CPUExecutionProvider"])
    name = session.get_outputs()[0].name
    ours = session.run([name], feeds)[0]
    (theirs,) = ngc_ort(encoder, feeds, [name])
    np.testing.assert_allclose(theirs, ours, atol=1e-4)


def test_greedy_int8_mostly_gives_the_fp32_tokens(graphs):
    model, config, src_tok, fp32, int8 = graphs
    cfg = model.cfg
    engine_config = EngineConfig.from_dict(config)
    max_new = seq2seq.TASKS["translate"].max_target_tokens
    sources = [src_tok.encode(s, add_special_tokens=False).ids + [cfg.eos_id] for s in SENTENCES]

    def decode(paths) -> list[list[int]]:
        engine = Engine(*paths, engine_config, threads=1)
        out: list[list[int]] = [[] for _ in sources]
        for i, source in enumerate(sources):
            engine.submit(Job(source, max_new, 1, lambda tokens, final, i=i: out[i].extend(tokens)))
        engine.run_until_idle()
        return out

    expected, got = decode(fp32), decode(int8)
    assert all(expected) and all(got)
    same = sum(a == b for a, b in zip(expected, got))
    assert same >= AGREEMENT_FLOOR * len(sources), f"{same}/{len(sources)} identical"
