"""`--task sentiment`: a Hugging Face `BertForSequenceClassification` folder → an endpoint answering as `sentiment`.

Writes ``<checkpoints>/<name>/``: encoder.onnx (input_ids, attention_mask int64 [B, S] → logits [B, labels], one
`com.microsoft::MultiHeadAttention` node per layer; with --int8 also encoder.int8.onnx), tokenizer.json (the
folder's own fast tokenizer, a `tokenizers` file), config.json (what serving/frontends/sentiment.py reads: the
labels in id order, the window and the [CLS]/[SEP] ids every window is read between) and README.md (where it
came from); and ``<tasks>/<name>.toml``, whose endpoint runs the graph in-process as `sentiment` does, long texts
in windows of whole sentences.

The weights stay Hugging Face's own modules; only the forward is written here, so that the attention becomes one
fused node (export/model/attention.py), as in our own models: BERT as transformers computes it, with absolute
positions and token types all 0 (a single text), post-norm layers, the pooler's tanh over [CLS] and the
classifier. Everything is checked before the first file is written: an unsupported folder raises ValueError
naming the config field and leaves nothing, and the exported graph must give transformers' probabilities.
"""

from __future__ import annotations

import json
import keyword
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from export.model.attention import AttentionLayer

Progress = Callable[[str], None]

ARCHITECTURE = "BertForSequenceClassification"
FRONT = "serving.frontends.sentiment:SentimentFront"
GRAPH, INT8_GRAPH = "encoder.onnx", "encoder.int8.onnx"  # the names the sentiment front opens
MAX_POSITIONS = 512  # BERT's own limit; a longer position table would only make windows slower
MIN_WINDOW = 8
NAME = re.compile(r"[a-z][a-z0-9_]*")
MARK = "# Imported from Hugging Face by `python -m export.import_hf`"  # the first line of every definition written
TOLERANCE = 1e-4  # probabilities: the graph against transformers, on PROBES
PROBES = (  # texts the import checks the tokenizer and the graph on: Chinese, English, digits, mixed, one long
    "这部电影不差",
    "服务一点也不好，再也不来了！",
    "很快，好吃，味道足，量大",
    "送餐太慢了，等了一个多小时，饭都凉了。",
    "The iPhone 15 Pro costs ¥7999 — 太贵了吧？",
    "ＡＢＣ全角字母和数字１２３，还有emoji😀",
    "味道还可以，就是有点贵。" * 6,
)


@dataclass(frozen=True)
class Imported:
    """What the import reads from the folder, checked before anything is written."""

    model: Any  # BertForSequenceClassification, float32, eval
    tokenizer: Any  # the tokenizers.Tokenizer to save: no truncation, no padding
    labels: tuple[str, ...]  # id2label in id order
    max_tokens: int  # a window's own tokens, [CLS] and [SEP] not counted
    cls_id: int
    sep_id: int


def import_classifier(
    source: Path, name: str, checkpoints: Path, tasks_dir: Path, int8: bool = False, say: Progress = print
) -> list[Path]:
    """Import the BertForSequenceClassification folder `source` as task `name`; returns the files written.

    An unsupported folder or name raises ValueError and leaves nothing; the files are made in a temporary folder
    and moved into ``checkpoints/name`` only once the graph gives transformers' probabilities."""
    source, checkpoints, tasks_dir = Path(source), Path(checkpoints), Path(tasks_dir)
    folder, definition = checkpoints / name, tasks_dir / f"{name}.toml"
    check_name(name, folder, definition)
    say(f"reading {source}")
    imported = read_folder(source)
    with tempfile.TemporaryDirectory(prefix=f"import-{name}-") as staging:
        write_checkpoint(Path(staging), source, name, imported, int8, say)
        if folder.exists():  # importing again: nothing of the earlier import stays (an int8 twin no longer asked for)
            shutil.rmtree(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staging, folder)
    definition.parent.mkdir(parents=True, exist_ok=True)
    definition.write_text(task_definition(source, name, imported, int8), encoding="utf-8")
    return [*sorted(folder.iterdir()), definition]


def write_checkpoint(folder: Path, source: Path, name: str, imported: Imported, int8: bool, say: Progress) -> None:
    """The graphs, checked against transformers, then the tokenizer, config.json and the model card."""
    say("exporting the encoder graph (fused attention)")
    graphs = [export_graph(imported.model, folder / GRAPH)]
    if int8:
        say("quantizing it to int8 (dynamic, MatMul weights)")
        graphs.append(quantize(folder / GRAPH, folder / INT8_GRAPH))
    differences = {path.name: graph_difference(path, imported) for path in graphs}
    if differences[GRAPH] > TOLERANCE:
        raise RuntimeError(
            f"the exported graph's probabilities differ from transformers' by {differences[GRAPH]:.2g} "
            f"(at most {TOLERANCE:g} expected); nothing was written"
        )
    imported.tokenizer.save(str(folder / "tokenizer.json"))
    write_json(folder / "config.json", serving_config(source, name, imported))
    (folder / "README.md").write_text(model_card(source, name, imported, differences), encoding="utf-8")


# -- checks: nothing is written before these pass -------------------------------------------------------------


def check_name(name: str, folder: Path, definition: Path) -> None:
    """The name becomes a Triton model, a definition file and an SDK method; it must not take another task's
    place. A folder or definition this importer wrote before is replaced (importing again); another is not."""
    if not NAME.fullmatch(name) or keyword.iskeyword(name):
        raise ValueError(f"name {name!r}: use lower-case letters, digits and _, starting with a letter")
    from tasks.definition import registry

    for task in registry().values():
        if task.source.resolve() == definition.resolve():
            continue
        taken = {task.name, *(e.name for e in task.endpoints()), *(m.name for m in task.models())}
        if name in taken:
            raise ValueError(f"name {name!r} is already served by task {task.name} ({task.source})")
    if definition.exists() and not definition.read_text(encoding="utf-8").startswith(MARK):
        raise ValueError(f"{definition} exists and was not written by this importer; choose another name")
    if folder.exists() and not _imported_before(folder):
        raise ValueError(f"{folder} exists and was not written by this importer; choose another name")


def _imported_before(folder: Path) -> bool:
    config = folder / "config.json"
    try:
        return "imported_from" in json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def read_folder(source: Path) -> Imported:
    """The folder's model, tokenizer and serving settings; ValueError naming what is not supported."""
    from transformers import AutoConfig

    if not (source / "config.json").is_file():
        raise ValueError(f"{source} has no config.json: a BertForSequenceClassification folder (save_pretrained)")
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=True)
    except ValueError as err:  # transformers' own checks of the fields
        raise ValueError(f"{source / 'config.json'}: {err}") from None
    check_config(config, source / "config.json")
    labels = label_names(config, source / "config.json")
    model = load_model(source, config)
    tokenizer, cls_id, sep_id = load_tokenizer(source, config)
    return Imported(model, tokenizer, labels, window_tokens(config, source), cls_id, sep_id)


def check_config(config: Any, where: Path) -> None:
    """Refuse what the exported forward does not compute: each ValueError names the config.json field."""

    def field(key: str, default: Any = None) -> Any:
        return getattr(config, key, default)

    problems = [
        (field("model_type") == "bert", f"model_type is {field('model_type')!r}; only 'bert' is supported"),
        (
            ARCHITECTURE in (field("architectures") or [ARCHITECTURE]),
            f"architectures is {field('architectures')}; only {ARCHITECTURE} (a fine-tuned classifier) is supported",
        ),
        (
            field("problem_type") in (None, "single_label_classification"),
            f"problem_type is {field('problem_type')!r}; only single-label classification is supported (one "
            "label per text, its probability from a softmax)",
        ),
        (
            len(field("id2label") or {}) >= 2,
            f"id2label has {len(field('id2label') or {})} label(s); a classifier of at least 2 labels is needed "
            "(one output is regression)",
        ),
        (
            field("position_embedding_type", "absolute") == "absolute",
            f"position_embedding_type is {field('position_embedding_type')!r}; only 'absolute' is supported",
        ),
        (not field("is_decoder", False), "is_decoder is true; only an encoder is supported"),
        (not field("add_cross_attention", False), "add_cross_attention is true; only an encoder is supported"),
        (field("type_vocab_size", 0) >= 1, "type_vocab_size is 0; token type 0 must exist"),
        (
            field("max_position_embeddings", 0) >= MIN_WINDOW + 2,
            f"max_position_embeddings is {field('max_position_embeddings')}; at least {MIN_WINDOW + 2} is needed",
        ),
    ]
    for ok, problem in problems:
        if not ok:
            raise ValueError(f"{where}: {problem}")


def label_names(config: Any, where: Path) -> tuple[str, ...]:
    """id2label in id order: the LABEL the endpoint answers."""
    id2label = {int(k): str(v) for k, v in config.id2label.items()}
    if sorted(id2label) != list(range(len(id2label))):
        raise ValueError(f"{where}: id2label must number the labels 0..{len(id2label) - 1}, got {sorted(id2label)}")
    labels = tuple(id2label[i] for i in range(len(id2label)))
    if len(set(labels)) != len(labels) or not all(label.strip() for label in labels):
        raise ValueError(f"{where}: id2label must name each label once, non-empty, got {list(labels)}")
    return labels


def load_model(source: Path, config: Any) -> Any:
    """The classifier in float32; every weight it computes with must come from the folder (a folder without a
    trained head, e.g. a pre-trained BertForMaskedLM, would get a random one)."""
    from transformers import BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the load report; missing weights are refused below, by name
    hf_logging.disable_progress_bar()
    model, info = BertForSequenceClassification.from_pretrained(
        source, config=config, dtype=torch.float32, local_files_only=True, output_loading_info=True
    )
    missing = sorted(info["missing_keys"])
    if missing:
        raise ValueError(
            f"{source}: the weights lack {', '.join(missing)}; only a fine-tuned {ARCHITECTURE} is supported "
            f"(config.json architectures: {getattr(config, 'architectures', None)})"
        )
    return model.eval()


def load_tokenizer(source: Path, config: Any) -> tuple[Any, int, int]:
    """The folder's fast tokenizer as a `tokenizers` file, and its [CLS] and [SEP] ids: the front tokenizes
    without special tokens and frames each window itself, so HF's ids must be exactly [CLS] + ids + [SEP]."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(source, local_files_only=True)
    if not getattr(hf, "is_fast", False):
        raise ValueError(f"{source}: tokenizer {type(hf).__name__} has no fast (`tokenizers`) version")
    cls_id, sep_id = hf.cls_token_id, hf.sep_token_id
    if cls_id is None or sep_id is None:
        raise ValueError(f"{source}: the tokenizer has no cls_token or sep_token")
    tokenizer = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    tokenizer.no_truncation()  # the front reads a long text in windows: it must see every token
    tokenizer.no_padding()
    largest = max(tokenizer.get_vocab().values())
    if largest >= config.vocab_size:
        raise ValueError(
            f"{source / 'config.json'}: vocab_size is {config.vocab_size}, but the tokenizer has id {largest}"
        )
    theirs = hf(list(PROBES))["input_ids"]
    ours = tokenizer.encode_batch(list(PROBES), add_special_tokens=False)
    for text, hf_ids, encoding in zip(PROBES, theirs, ours, strict=True):
        if list(hf_ids) != [cls_id, *encoding.ids, sep_id]:
            raise ValueError(f"{source}: the tokenizer does not frame a text as [CLS] tokens [SEP] ({text!r})")
    return tokenizer, cls_id, sep_id


def window_tokens(config: Any, source: Path) -> int:
    """A window's own tokens: the position table (at most :data:`MAX_POSITIONS`, and the tokenizer's
    model_max_length where it sets one) less [CLS] and [SEP]."""
    limit = min(config.max_position_embeddings, MAX_POSITIONS)
    tokenizer_config = source / "tokenizer_config.json"
    if tokenizer_config.is_file():
        length = json.loads(tokenizer_config.read_text(encoding="utf-8")).get("model_max_length")
        if isinstance(length, int) and MIN_WINDOW + 2 <= length < limit:
            limit = length
    return limit - 2


# -- the forward, with fused attention --------------------------------------------------------------------------


class FusedSelfAttention(AttentionLayer):
    """A BERT layer's self-attention: its query, key and value projections, the attention computed by
    export/model/attention.py, which exports it as one `com.microsoft::MultiHeadAttention` node."""

    def __init__(self, hf_attention: nn.Module, n_heads: int) -> None:
        super().__init__(n_heads, dropout=0.0)
        self.query, self.key, self.value = hf_attention.query, hf_attention.key, hf_attention.value

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        return self.attend(self.query(x), self.key(x), self.value(x), key_padding_mask=mask).out


class PostNormLayer(nn.Module):
    """Post-norm: x = LN(x + SelfAttn(x)), then x = LN(x + FFN(x)), with the Hugging Face layer's modules."""

    def __init__(self, hf_layer: nn.Module, n_heads: int) -> None:
        super().__init__()
        self.attention = FusedSelfAttention(hf_layer.attention.self, n_heads)
        self.attention_output = hf_layer.attention.output  # dense, dropout, LayerNorm(out + x)
        self.intermediate = hf_layer.intermediate  # dense, activation
        self.output = hf_layer.output  # dense, dropout, LayerNorm(out + x)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.attention_output(self.attention(x, mask), x)
        return self.output(self.intermediate(x), x)


@dataclass(frozen=True)
class GraphShape:
    """What export_encoder_classifier reads of a model (`model.cfg`): its example ids and longest sequence."""

    vocab_size: int
    max_len: int


class BertClassifierGraph(nn.Module):
    """(input_ids, attention_mask) [B, S] → logits [B, labels], as BertForSequenceClassification computes them
    for a single text (token types all 0) padded on the right."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        config, bert = model.config, model.bert
        embeddings = bert.embeddings
        self.words, self.positions, self.norm = (
            embeddings.word_embeddings,
            embeddings.position_embeddings,
            embeddings.LayerNorm,
        )
        # A single text's token types are all 0: their embedding is one constant row, baked in.
        self.register_buffer("token_type", embeddings.token_type_embeddings.weight[0].detach().clone())
        self.layers = nn.ModuleList(PostNormLayer(layer, config.num_attention_heads) for layer in bert.encoder.layer)
        self.pooler, self.classifier = bert.pooler, model.classifier
        self.cfg = GraphShape(config.vocab_size, config.max_position_embeddings)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.words(input_ids) + self.positions.weight[: input_ids.shape[1]] + self.token_type
        x = self.norm(x)
        for layer in self.layers:
            x = layer(x, attention_mask)
        return self.classifier(self.pooler(x))


def export_graph(model: nn.Module, path: Path) -> Path:
    """encoder.onnx, with dynamic batch and sequence axes and fused attention (export/graphs/onnx_export.py)."""
    from export.graphs.onnx_export import export_encoder_classifier

    graph = BertClassifierGraph(model).eval()
    with torch.no_grad():
        return export_encoder_classifier(graph, path, example_len=min(16, graph.cfg.max_len))


def quantize(src: Path, dst: Path) -> Path:
    """The int8 twin: MatMul weights int8, activations quantized on the fly, as the engine's int8 graphs."""
    from export.graphs.step_export import quantize_graph

    quantize_graph(src, dst)
    return dst


def framed_batch(imported: Imported, texts: Sequence[str]) -> dict[str, np.ndarray]:
    """Feeds as the sentiment front builds them: [CLS] tokens [SEP], padded with 0 on the right."""
    encodings = imported.tokenizer.encode_batch(list(texts), add_special_tokens=False)
    rows = [[imported.cls_id, *e.ids[: imported.max_tokens], imported.sep_id] for e in encodings]
    ids = np.zeros((len(rows), max(map(len, rows))), dtype=np.int64)
    mask = np.zeros_like(ids)
    for number, row in enumerate(rows):
        ids[number, : len(row)], mask[number, : len(row)] = row, 1
    return {"input_ids": ids, "attention_mask": mask}


def graph_difference(path: Path, imported: Imported) -> float:
    """The largest difference between the graph's probabilities and transformers' on :data:`PROBES`."""
    from serving.providers import inference_session

    feeds = framed_batch(imported, PROBES)
    session = inference_session(path)
    (logits,) = session.run(["logits"], feeds)
    with torch.no_grad():
        expected = imported.model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits
    return float(np.abs(softmax(logits) - expected.softmax(-1).numpy()).max())


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# -- what is written ---------------------------------------------------------------------------------------------


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def serving_config(source: Path, name: str, imported: Imported) -> dict:
    """config.json as serving/frontends/sentiment.py reads it."""
    config = imported.model.config
    return {
        "task": name,
        "architecture": ARCHITECTURE,
        "imported_from": str(source.resolve()),
        "labels": list(imported.labels),
        "max_tokens": imported.max_tokens,
        "prefix_ids": [imported.cls_id],
        "suffix_ids": [imported.sep_id],
        "tokenizer": "wordpiece",
        "model": {
            "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size,
            "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads,
            "intermediate_size": config.intermediate_size,
            "hidden_act": str(config.hidden_act),
            "max_position_embeddings": config.max_position_embeddings,
        },
    }


def toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's."""
    return json.dumps(text, ensure_ascii=False)


def command(source: Path, name: str, int8: bool) -> str:
    return f"python -m export.import_hf {source} --task sentiment --name {name}{' --int8' if int8 else ''}"


def task_definition(source: Path, name: str, imported: Imported, int8: bool) -> str:
    """The task's definition (tasks/definition.py): `sentiment`'s endpoint, its graph from the checkpoint."""
    labels = ", ".join(imported.labels)
    about = toml_string(f"LABEL is one of {labels} (the checkpoint's id2label), SCORE its probability.")
    model = f"a BERT classifier imported from Hugging Face: {labels}"
    summary = toml_string(f"classify texts with {name} ({model}); prints label, score and text per line")
    precision = '\nprecision = "int8"  # encoder.int8.onnx' if int8 else ""
    return f'''{MARK}
# from {source.resolve()}: `{command(source, name, int8)}`. Import again rather than editing by hand.
summary = {summary}
example = 'python -m clients {name} "这部电影不差" "太难看了"'
checkpoint = "{name}"
assets = ["tokenizer.json", "config.json"]
result = "Sentiment"  # the SDK's answer: Sentiment(label, score)

[endpoint]
front = "{FRONT}"
about = {about}
max_batch_size = 64
# As `sentiment`: two instances, each running its copy of the graph in-process with one ONNX Runtime thread. A
# BERT encoder is far slower than ours, so requests may wait longer before the queue refuses them.
instances = 2
queue = {{ max_size = 256, timeout_s = 5 }}
graphs = "export.build_repository:imported_graphs"
threads = 1{precision}
outputs = [
  {{ name = "LABEL", type = "string" }},
  {{ name = "SCORE", type = "fp32" }},
]

[loadtest]
weight = 1
file = "sentiment/waimai_10k/waimai_10k.csv"  # label,review with a header
column = "review"
header = true
paragraphs = true
texts = [
  "这部电影不差",
  "服务一点也不好",
  "很快，好吃，味道足，量大",
  "送餐太慢了，等了一个多小时，饭都凉了",
  "味道还可以，就是有点贵",
  "包装很用心，下次还会再点",
]
'''


def model_card(source: Path, name: str, imported: Imported, differences: dict[str, float]) -> str:
    config = imported.model.config
    checked = ", ".join(f"{file} {difference:.1e}" for file, difference in differences.items())
    return f"""# {name}: BertForSequenceClassification imported from Hugging Face

Imported from `{source.resolve()}` by `{command(source, name, INT8_GRAPH in differences)}`
(export/import_hf/bert.py). The weights, vocabulary and licence are that folder's: read its model card for what it
was trained on and the terms of its use.

- {config.num_hidden_layers} layers, hidden size {config.hidden_size}, {config.num_attention_heads} heads, \
vocabulary {config.vocab_size:,}
- labels (id2label): {", ".join(imported.labels)}; SCORE is the softmax probability of the label answered
- a text is read in windows of at most {imported.max_tokens} tokens, each as `[CLS] tokens [SEP]` (id \
{imported.cls_id}, {imported.sep_id}); a longer text's windows are whole sentences, their logits averaged \
(serving/frontends/windows.py)
- graphs: {", ".join(differences)}; largest probability difference from transformers on the import's probe \
texts: {checked}
"""
