"""The CTranslate2 baseline: checkpoints/translate converted to CTranslate2 decodes like our ONNX generator.

The full-test-set agreement is `python -m benchmarks.ctranslate2_baseline`; here the everyday sentences of
test_generation_parity (no dataset needed), greedy, one thread. `ctranslate2` comes with the bench extra: without
it these tests fail, they do not skip.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from everyday import SENTENCES

from benchmarks import ctranslate2_baseline as ct2
from serving.text.tokenizer import BOS, EOS, UNK

pytestmark = pytest.mark.export  # converts the checkpoint and runs the ONNX generator: seconds


def require_ctranslate2() -> None:
    try:
        import ctranslate2  # noqa: F401
    except ImportError as err:
        reason = str(err)
    else:
        return
    pytest.fail(
        f"ctranslate2 is not installed ({reason}): the CTranslate2 baseline needs it "
        "(pip install ctranslate2, pinned beside the bench extra)",
        pytrace=False,
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ct2")


def converted(workdir: Path) -> Path:
    """The float32 CTranslate2 model of the shipped checkpoint (converted once per module)."""
    require_ctranslate2()
    model_dir = workdir / "float32"
    if not (model_dir / "model.bin").exists():
        ct2.convert(ct2.CHECKPOINT, model_dir)
    return model_dir


def test_greedy_tokens_equal_the_onnx_generator(workdir):
    model_dir = converted(workdir)
    max_new = ct2.served_max_new_tokens()
    baseline = ct2.Baseline.load(model_dir, threads=1)
    ours = baseline.generate(baseline.source_tokens(SENTENCES), beam_size=1, max_decoding_length=max_new)

    session = ct2.onnx_generator(threads=1, scratch=workdir)  # model_repository's, else exported here
    reference = ct2.onnx_generate(session, baseline.src_tokenizer, baseline.max_tokens, SENTENCES, 1, max_new)

    report = ct2.agreement(reference, ours)
    assert report["equal"] >= 0.95 * len(SENTENCES), report
    assert all(reference), "the ONNX generator produced an empty translation"


def test_translate_returns_text_and_the_model_dir_holds_the_checkpoint_settings(workdir):
    model_dir = converted(workdir)
    texts = ct2.translate(model_dir, SENTENCES[:4], beam_size=4, max_decoding_length=48, threads=1)
    assert len(texts) == 4 and all(isinstance(t, str) and t for t in texts)

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    assert config["layer_norm_epsilon"] == pytest.approx(1e-5)
    special = (config["decoder_start_token"], config["bos_token"], config["eos_token"], config["unk_token"])
    assert special == (BOS, BOS, EOS, UNK)
    baseline = ct2.Baseline.load(model_dir, threads=1)
    assert baseline.length_penalty == 2.0 and baseline.max_tokens == 64
    # the front model's truncation: 63 source tokens, then eos
    tokens = baseline.source_tokens(["我" * 100])[0]
    assert len(tokens) == 64 and tokens[-1] == EOS
