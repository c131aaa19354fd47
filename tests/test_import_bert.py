"""`python -m export.import_hf PATH --task sentiment`: a Hugging Face BertForSequenceClassification folder becomes an
endpoint that answers as `sentiment` does, with transformers' own probabilities.

The folder is built here with transformers' own classes (no hub): a WordPiece tokenizer trained on Chinese reviews
(../shared/data's waimai_10k when it is there, else built-in sentences), a two-layer BERT trained a few dozen steps
so that its answers are not uniform, both saved with save_pretrained.
"""

from __future__ import annotations

import csv
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from export.graphs.onnx_export import count_ops
from export.import_hf.bert import import_classifier
from serving.frontends.base import BatchTokenizer
from serving.frontends.sentiment import POOLING, SentimentFront
from serving.frontends.windows import pool, window_rows
from tasks import PATH_VARIABLE, load

ROOT = Path(__file__).resolve().parents[1]
REVIEWS = ROOT.parent / "shared" / "data" / "sentiment" / "waimai_10k" / "waimai_10k.csv"
NAME, INT8_NAME = "review_bert", "review_bert_int8"  # the same folder imported twice: fp32, and with --int8
LABELS = {0: "negative", 1: "positive"}
MAX_POSITIONS = 64  # windows of 62 tokens: a few reviews joined are read in several
# Not 2 and 3, the project's own bos/eos ids: the front must take [CLS] and [SEP] from config.json.
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[MASK]", "[unused1]", "[CLS]", "[SEP]"]

GOOD = ["味道不错", "送得很快", "分量很足", "服务热情", "包装很用心", "性价比很高", "下次还会再点", "老板人很好"]
BAD = ["太难吃了", "送餐太慢", "菜都凉了", "服务态度很差", "分量太少", "再也不点了", "等了一个多小时", "有头发"]
OPENERS = ["", "今天点的外卖，", "第二次点了，", "说实话，", "the food was ok，", "APP上看到的"]


def built_in_reviews() -> list[tuple[int, str]]:
    """A few hundred labelled reviews from clauses, for a checkout without ../shared/data."""
    rng = random.Random(0)
    reviews = []
    for label, clauses in ((1, GOOD), (0, BAD)):
        for _ in range(200):
            first, second = rng.sample(clauses, 2)
            reviews.append((label, f"{rng.choice(OPENERS)}{first}，{second}{rng.choice(['', '！', '。', '~'])}"))
    rng.shuffle(reviews)
    return reviews


def reviews() -> list[tuple[int, str]]:
    """400 labelled reviews, half of each label: waimai_10k's when ../shared/data is there."""
    if not REVIEWS.is_file():
        return built_in_reviews()
    with REVIEWS.open(encoding="utf-8") as f:
        rows = [(int(row["label"]), row["review"].strip()) for row in csv.DictReader(f) if row["review"].strip()]
    rng = random.Random(0)
    sample = [pair for label in (0, 1) for pair in rng.sample([r for r in rows if r[0] == label], 200)]
    rng.shuffle(sample)
    return sample


def train_tokenizer(texts: list[str]):
    """A BERT-style WordPiece tokenizer (BertNormalizer splits Chinese characters), as transformers wraps it."""
    from transformers import BertTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=2000, special_tokens=SPECIAL_TOKENS))
    return BertTokenizerFast(tokenizer_object=tokenizer, model_max_length=MAX_POSITIONS)


def train_classifier(tokenizer, data: list[tuple[int, str]]):
    """A tiny BertForSequenceClassification, trained 40 steps: not uniform, not to be believed."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=MAX_POSITIONS, id2label=LABELS, label2id={v: k for k, v in LABELS.items()},
    )  # fmt: skip
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    rng = random.Random(1)
    model.train()
    for _ in range(40):
        batch = rng.sample(data, 32)
        inputs = tokenizer([t for _, t in batch], padding=True, truncation=True, return_tensors="pt")
        loss = model(**inputs, labels=torch.tensor([label for label, _ in batch])).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """A fine-tuned BertForSequenceClassification folder, as a team would have it (save_pretrained)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one core is plenty, and the other stays free
    try:
        data = reviews()
        tokenizer = train_tokenizer([text for _, text in data])
        model = train_classifier(tokenizer, data)
    finally:
        torch.set_num_threads(threads)
    folder = tmp_path_factory.mktemp("hf") / "bert-review-finetune"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def hf_model(hf_folder):
    from transformers import AutoTokenizer, BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(hf_folder, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(hf_folder)


@pytest.fixture(scope="module")
def imported(hf_folder, tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoints, tasks folder) after `import_classifier` as NAME (fp32) and INT8_NAME (--int8)."""
    root = tmp_path_factory.mktemp("imported")
    checkpoints, tasks_dir = root / "checkpoints", root / "tasks"
    import_classifier(hf_folder, NAME, checkpoints, tasks_dir, say=lambda _: None)
    import_classifier(hf_folder, INT8_NAME, checkpoints, tasks_dir, int8=True, say=lambda _: None)
    return checkpoints, tasks_dir


@pytest.fixture(scope="module")
def texts(hf_model) -> list[str]:
    """60 reviews that fit one window (transformers reads at most 64 positions), short to long, plus mixed English,
    digits, full-width characters and an emoji."""
    _, tokenizer = hf_model
    candidates = [text for _, text in reviews()[-300:]]
    fits = [t for t in candidates if len(tokenizer(t)["input_ids"]) <= MAX_POSITIONS]
    mixed = ["The delivery was FAST，味道 great!", "１２３号送到，ＯＫ", "买了3份iPhone壳😀", "很好吃"]
    return sorted(fits[:56], key=len) + mixed


def hf_probabilities(hf_model, texts: list[str]) -> np.ndarray:
    model, tokenizer = hf_model
    with torch.no_grad():
        logits = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits
    return logits.softmax(-1).numpy()


def framed_feeds(checkpoint: Path, texts: list[str]) -> tuple[dict[str, np.ndarray], list[list[int]]]:
    """What the sentiment front feeds its encoder for texts that fit a window: [CLS] ids [SEP], padded with 0."""
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    rows = [
        [*config["prefix_ids"], *e.ids, *config["suffix_ids"]]
        for e in tokenizer.encode_batch(texts, add_special_tokens=False)
    ]
    ids = np.zeros((len(rows), max(map(len, rows))), dtype=np.int64)
    for number, row in enumerate(rows):
        ids[number, : len(row)] = row
    return {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64)}, rows


def graph_probabilities(graph: Path, texts: list[str]) -> np.ndarray:
    """The graph's probabilities for texts that fit a window, fed as the sentiment front feeds it."""
    feeds, _ = framed_feeds(graph.parent, texts)
    (logits,) = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(["logits"], feeds)
    return softmax(logits)


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# -- the export ---------------------------------------------------------------------------------------------------


@pytest.mark.export
def test_the_graph_gives_transformers_probabilities_with_one_fused_attention_per_layer(imported, hf_model, texts):
    checkpoints, _ = imported
    checkpoint = checkpoints / NAME
    graph = checkpoint / "encoder.onnx"
    ops = count_ops(graph)
    assert ops["com.microsoft::MultiHeadAttention"] == hf_model[0].config.num_hidden_layers == 2
    assert "ai.onnx::Softmax" not in ops  # no attention computed outside the fused nodes
    proto = onnx.load(str(graph))
    assert [i.name for i in proto.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in proto.graph.output] == ["logits"]

    _, rows = framed_feeds(checkpoint, texts)
    assert rows == [list(ids) for ids in hf_model[1](texts)["input_ids"]]  # the tokenizer file gives HF's ids
    probabilities, expected = graph_probabilities(graph, texts), hf_probabilities(hf_model, texts)
    assert len(texts) >= 50
    np.testing.assert_allclose(probabilities, expected, atol=1e-4, rtol=0)
    assert set(expected.argmax(-1)) == {0, 1}  # trained: both labels are answered


@pytest.mark.export
def test_the_checkpoint_and_definition_are_what_the_sentiment_front_reads(imported, hf_folder):
    checkpoints, tasks_dir = imported
    checkpoint = checkpoints / NAME
    files = sorted(p.name for p in checkpoint.iterdir())
    assert files == ["README.md", "config.json", "encoder.onnx", "tokenizer.json"]
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    assert config["labels"] == ["negative", "positive"]
    assert config["max_tokens"] == MAX_POSITIONS - 2  # [CLS] and [SEP] take two positions
    assert (config["prefix_ids"], config["suffix_ids"]) == ([4], [5])
    assert str(hf_folder.resolve()) in (checkpoint / "README.md").read_text(encoding="utf-8")
    task = load(tasks_dir / f"{NAME}.toml")
    assert (task.name, task.checkpoint) == (NAME, NAME)
    assert task.endpoint.front == "serving.frontends.sentiment:SentimentFront"
    assert task.endpoint.graphs == "export.build_repository:imported_graphs" and task.endpoint.precision == "fp32"
    assert not task.endpoint.models and task.explain is None  # the graph runs in-process: no BLS model
    assert [(t.name, t.type) for t in task.endpoint.outputs] == [("LABEL", "string"), ("SCORE", "fp32")]
    assert task.loadtest.texts and task.assets == ("tokenizer.json", "config.json")


class Rows:
    """Stands in for the front's ONNX Runtime session and metrics: records the rows it is fed."""

    def __init__(self) -> None:
        self.rows: list[list[int]] = []

    def run(self, outputs, feeds):
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        self.rows += [list(row[m == 1]) for row, m in zip(ids, mask, strict=True)]
        return [np.zeros((len(ids), 2), dtype=np.float32)]

    def encoded(self, lengths, truncated) -> None: ...

    def windows(self, counts) -> None: ...


@pytest.mark.export
def test_the_front_frames_every_window_as_transformers_does(imported, hf_model):
    checkpoints, _ = imported
    checkpoint = checkpoints / NAME
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    front = SentimentFront.__new__(SentimentFront)  # no Triton: only what run_group uses
    front.tokenizer = BatchTokenizer.from_file(checkpoint / "tokenizer.json", config["max_tokens"])
    front.labels = config["labels"]
    front.prefix, front.suffix = tuple(config["prefix_ids"]), tuple(config["suffix_ids"])
    front.session = front.metrics = Rows()
    emptied = "\u0301"  # a lone accent: the BERT normalizer strips it, transformers reads [CLS] [SEP]
    front.window_logits(["很好吃", emptied])
    assert sorted(front.session.rows) == sorted(list(ids) for ids in hf_model[1](["很好吃", emptied])["input_ids"])


@pytest.mark.export
def test_int8_writes_the_quantized_twin_that_the_endpoint_serves(imported, hf_model, texts):
    checkpoints, tasks_dir = imported
    assert sorted(p.name for p in (checkpoints / INT8_NAME).glob("*.onnx")) == ["encoder.int8.onnx", "encoder.onnx"]
    ops = count_ops(checkpoints / INT8_NAME / "encoder.int8.onnx")
    assert ops.get("ai.onnx::MatMulInteger", 0) > 0 and ops["com.microsoft::MultiHeadAttention"] == 2
    assert load(tasks_dir / f"{INT8_NAME}.toml").endpoint.precision == "int8"
    probabilities = graph_probabilities(checkpoints / INT8_NAME / "encoder.int8.onnx", texts)
    assert np.abs(probabilities - hf_probabilities(hf_model, texts)).max() < 0.02


# -- refusals: nothing written ---------------------------------------------------------------------------------------

REFUSED = [
    ({"model_type": "roberta"}, "model_type"),
    ({"architectures": ["BertForMaskedLM"]}, "architectures"),
    ({"problem_type": "multi_label_classification"}, "problem_type"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"problem_type": "regression", "id2label": {"0": "stars"}, "label2id": {"stars": 0}}, "problem_type"),
    ({"problem_type": None, "id2label": {"0": "stars"}, "label2id": {"stars": 0}}, "id2label"),
]


@pytest.mark.parametrize(("change", "field"), REFUSED, ids=[f"{field}={list(c.values())[0]}" for c, field in REFUSED])
def test_an_unsupported_config_is_refused_by_its_field_and_nothing_is_written(hf_folder, tmp_path, change, field):
    folder = tmp_path / "folder"
    shutil.copytree(hf_folder, folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps(config | change), encoding="utf-8")
    with pytest.raises(ValueError, match=field):
        import_classifier(folder, NAME, tmp_path / "ck", tmp_path / "tasks", say=lambda _: None)
    assert not (tmp_path / "ck").exists() and not (tmp_path / "tasks").exists()


def test_a_folder_without_a_trained_head_is_refused(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    BertForMaskedLM(config).save_pretrained(tmp_path / "mlm")
    config_json = json.loads((tmp_path / "mlm" / "config.json").read_text(encoding="utf-8"))
    del config_json["architectures"]  # no hint there: the missing weights must give it away
    (tmp_path / "mlm" / "config.json").write_text(json.dumps(config_json), encoding="utf-8")
    with pytest.raises(ValueError, match="classifier.weight"):
        import_classifier(tmp_path / "mlm", NAME, tmp_path / "ck", tmp_path / "tasks", say=lambda _: None)
    assert not (tmp_path / "ck").exists() and not (tmp_path / "tasks").exists()


@pytest.mark.parametrize("name", ["sentiment", "sentiment_encoder", "translate_stream", "Bad-Name", "class"])
def test_a_name_taken_or_unusable_is_refused(hf_folder, tmp_path, name):
    with pytest.raises(ValueError, match="already served|lower-case"):
        import_classifier(hf_folder, name, tmp_path / "ck", tmp_path / "tasks", say=lambda _: None)
    assert not (tmp_path / "ck").exists() and not (tmp_path / "tasks").exists()


# -- served by the real Triton ------------------------------------------------------------------------------------


def run(*argv: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, env=os.environ)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def long_review(texts: list[str]) -> str:
    """Reviews joined as one text, longer than a window."""
    return "".join(t if t[-1] in "。！？!?" else t + "。" for t in texts[-12:])


def windowed_probabilities(hf_model, checkpoint: Path, text: str) -> tuple[np.ndarray, int]:
    """What the endpoint should answer for a long text: transformers on each window ([CLS] window [SEP]), the
    windows' logits pooled as the sentiment front pools them; and the number of windows."""
    model, _ = hf_model
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    encoding = Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(text, add_special_tokens=False)
    read = window_rows([text], [encoding], config["max_tokens"])
    rows = [[*config["prefix_ids"], *row, *config["suffix_ids"]] for row in read.rows]
    ids = torch.zeros((len(rows), max(map(len, rows))), dtype=torch.long)
    for number, row in enumerate(rows):
        ids[number, : len(row)] = torch.tensor(row)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=(ids != 0).long()).logits.numpy()
    return softmax(pool(logits, [len(r) for r in rows], POOLING)[None, :])[0], len(rows)


@pytest.mark.server
def test_the_server_answers_with_transformers_labels_and_scores(imported, hf_model, texts, tmp_path, monkeypatch):
    from clients import Client
    from serving.launcher.embedded import EmbeddedTriton, ServerOptions, free_ports

    checkpoints, tasks_dir = imported
    monkeypatch.setenv(PATH_VARIABLE, str(tasks_dir))
    repository = tmp_path / "repository"
    tasks = ("--task", NAME, "--task", INT8_NAME)
    run("-m", "tasks", "generate", *tasks, "--repository", str(repository))
    run("-m", "export.build_repository", *tasks, "--repository", str(repository), "--checkpoints", str(checkpoints))
    assert sorted(p.name for p in repository.iterdir() if p.is_dir()) == [NAME, INT8_NAME]  # no BLS model

    expected = hf_probabilities(hf_model, texts)
    long_text = long_review(texts)
    long_expected, windows = windowed_probabilities(hf_model, checkpoints / NAME, long_text)
    assert windows > 1
    http, grpc, metrics = free_ports(3)
    options = ServerOptions(model_repository=repository, http_port=http, grpc_port=grpc, metrics_port=metrics)
    server = EmbeddedTriton(options)
    server.start()
    try:
        for protocol, url in (("grpc", server.grpc_url), ("http", server.http_url)):
            with Client(url, protocol) as client:
                answers = getattr(client, NAME)(texts)
                assert [a.label for a in answers] == [LABELS[int(k)] for k in expected.argmax(-1)], protocol
                np.testing.assert_allclose([a.score for a in answers], expected.max(-1), atol=1e-4, rtol=0)
                (answer,) = getattr(client, NAME)(long_text)  # read whole, in windows
                assert answer.label == LABELS[int(long_expected.argmax())]
                assert answer.score == pytest.approx(long_expected.max(), abs=1e-4)
                # precision = "int8": the front runs encoder.int8.onnx. Its activations are quantized per call, so
                # its answers depend a little on the batch: close to transformers', yet not the float graph's.
                int8_scores = np.array([a.score for a in getattr(client, INT8_NAME)(texts)])
                assert np.abs(int8_scores - expected.max(-1)).max() < 0.02
                assert np.abs(int8_scores - np.array([a.score for a in answers])).max() > 1e-5
    finally:
        server.stop()
