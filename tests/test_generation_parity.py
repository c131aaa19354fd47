"""The trained translation checkpoint: ONNX BeamSearch generation equals the PyTorch reference.

The full-test-set measurement (`python -m export.graphs.parity translate`) is committed in
checkpoints/translate/parity.json; here the same comparison runs on sentences written for the
test, so it needs no dataset.
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
import pytest

from export.graphs.parity import agreement
from export.graphs.seq2seq_export import export_generator
from export.training import seq2seq

pytestmark = pytest.mark.export  # exports and runs ONNX generators: seconds each

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / "checkpoints" / "translate"
SENTENCES = [
    "我爱你。",
    "他休息两天。",
    "我只有几支笔。",
    "今天天气很好。",
    "你叫什么名字？",
    "我们明天去北京。",
    "这本书很有意思。",
    "她每天早上喝咖啡。",
    "我不知道他在哪里。",
    "请把门关上。",
    "你会说中文吗？",
    "我的猫喜欢睡觉。",
    "他们在公园里踢足球。",
    "这个问题很难回答。",
    "我昨天买了一辆新车。",
    "火车几点出发？",
    "我想学习日语。",
    "汤姆是我最好的朋友。",
    "外面在下雨。",
    "你能帮我一下吗？",
    "我已经吃过晚饭了。",
    "这是我第一次来中国。",
    "他比我高。",
    "我们应该早点回家。",
    "她的妈妈是医生。",
    "我喜欢听音乐。",
    "这家餐厅的菜很好吃。",
    "我忘了带钥匙。",
    "明天会下雪吗？",
    "孩子们在学校学习。",
    "我每天走路去上班。",
    "你为什么不来？",
    "这件衣服太贵了。",
    "我觉得他说得对。",
    "请慢慢说。",
    "我很高兴见到你。",
    "他正在看电视。",
    "我们需要更多的时间。",
    "医院在哪里？",
    "我会尽力的。",
]


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
