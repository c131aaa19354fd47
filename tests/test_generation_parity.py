"""The trained translation checkpoint: ONNX BeamSearch generation equals the PyTorch reference.

The full-test-set measurement (`python -m export.graphs.parity translate`) is committed in
checkpoints/translate/parity.json; here the same comparison runs on sentences written for the
test, so it needs no dataset.
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
import pytest
from everyday import SENTENCES

from export.graphs.parity import agreement
from export.graphs.seq2seq_export import export_generator
from export.training import seq2seq

pytestmark = pytest.mark.export  # exports and runs ONNX generators: seconds each

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / "checkpoints" / "translate"


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    model, config, src_tok, tgt_tok = seq2seq.load(CHECKPOINT)
    task = seq2seq.TASKS["translate"]
    path = export_generator(model, tmp_path_factory.mktemp("gen") / "g.onnx", max_len=task.max_target_tokens + 1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    sources = [src_tok.encode(s, add_special_tokens=False).ids[: task.max_source_tokens - 1] + [3] for s in SENTENCES]
    return model, session, sources, task


def test_greedy_onnx_equals_pytorch(generator):
    model, session, sources, task = generator
    report = agreement(model, session, sources, task.max_target_tokens, 1, batch_size=16)
    assert report["agreement"] >= 0.99, report["mismatch_examples"]


def test_beam4_onnx_agrees_with_pytorch(generator):
    model, session, sources, task = generator
    report = agreement(model, session, sources, task.max_target_tokens, 4, batch_size=16)
    assert report["agreement"] >= 0.95, report["mismatch_examples"]
