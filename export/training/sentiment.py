"""Sentiment task: data → tokenizer → RoPE encoder classifier → metrics → checkpoint."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from export.model.checkpoint import CONFIG_FILE, load_weights, read_json, round_to_stored_precision, save_checkpoint
from export.model.config import ModelConfig
from export.model.transformer import Encoder, SentimentClassifier
from export.training.data import LabelledText, negation_examples, sentiment_splits
from export.training.loop import TrainConfig, drop_tokens, length_batches, pad_batch, train
from serving.text.tokenizer import UNK_ID, load_tokenizer, train_or_resume, train_tokenizer


class MaskedLanguageModel(nn.Module):
    """Pre-training head for an encoder: predict masked tokens from both sides (BERT's objective).

    Shares the encoder object (and ties the output projection to its token embedding), so after
    pre-training the same encoder goes into the classifier.
    """

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder
        self.bias = nn.Parameter(torch.zeros(encoder.cfg.vocab_size))

    def forward(self, input_ids: Tensor, attention_mask: Tensor, targets: Tensor) -> Tensor:
        """The masked-token loss. Only the target positions (not -100 in `targets` [B, S]) are projected onto
        the vocabulary: about 15% of them, where projecting every position made the [B, S, V] logits most of a
        pre-training step's cost."""
        h = self.encoder(input_ids, attention_mask)  # [B, S, D]
        chosen = targets != -100
        if not chosen.any():  # a batch of few tokens may draw none: no loss rather than the mean of nothing
            return h.sum() * 0.0
        logits = h[chosen] @ self.encoder.embed.weight.T + self.bias  # [N, V]
        return F.cross_entropy(logits.float(), targets[chosen])


LABELS = ["negative", "positive"]  # index = class id
# Negated reviews (label, text) the checkpoints are scored on: never part of the synthetic training templates
# (negation_examples leaves them out), and none built like them. The first twelve were written before the shipped
# checkpoint was trained, the last ten after it, and none of those ten is a text of any of the five review sets.
NEGATION_PROBES = [
    ("positive", "这部电影不差"),
    ("negative", "服务一点也不好"),
    ("positive", "这本书一点都不枯燥"),
    ("positive", "手机用了半年也没出过问题"),
    ("positive", "这次买的鞋子没有让我失望"),
    ("positive", "这家餐厅的菜一点儿也不咸"),
    ("positive", "耳机戴久了耳朵也不疼"),
    ("negative", "房间没有图片上那么好看"),
    ("negative", "这部电影根本不值得看"),
    ("negative", "客服从来不回消息"),
    ("negative", "衣服的质量没有想象中好"),
    ("negative", "不是很推荐这家店"),
    ("positive", "酒店的早餐没什么可挑剔的"),
    ("negative", "这个价格一点都不值"),
    ("positive", "房间虽然小但一点也不压抑"),
    ("negative", "再也不会来这家酒店了"),
    ("positive", "用了三个月没有任何毛病"),
    ("negative", "电池根本撑不过一天"),
    ("positive", "这本书让人放不下"),
    ("negative", "前台的态度实在不敢恭维"),
    ("positive", "孩子吃了从来没有闹过肚子"),
    ("negative", "说是正品，可是一点也不像"),
]
TOKENIZER_FILE = "tokenizer.json"


def mask_tokens(
    x: torch.Tensor, mask: torch.Tensor, vocab_size: int, rate: float = 0.15
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT-style masking: 15% of real tokens become targets; of those 80% → [UNK] (our mask
    token), 10% → a random token, 10% unchanged. Returns (inputs, targets with -100 elsewhere)."""
    chosen = (torch.rand(x.shape) < rate) & (mask == 1)
    targets = x.masked_fill(~chosen, -100)
    roll = torch.rand(x.shape)
    inputs = x.masked_fill(chosen & (roll < 0.8), UNK_ID)
    random_ids = torch.randint(4, vocab_size, x.shape)
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    return torch.where(swap, random_ids, inputs), targets


def encode(tokenizer, texts: list[str], max_tokens: int) -> list[list[int]]:
    return [enc.ids[:max_tokens] for enc in tokenizer.encode_batch(texts)]


@torch.no_grad()
def predict(model: nn.Module, ids: list[list[int]], batch_tokens: int = 8192) -> torch.Tensor:
    """Class probabilities [N, 2] for pre-tokenized texts, batched by length."""
    model.eval()
    probs = torch.zeros(len(ids), 2)
    for batch in length_batches([len(x) for x in ids], batch_tokens, 256, None):
        x, m = pad_batch([ids[i] or [0] for i in batch])
        probs[batch] = model(x, m).softmax(-1)
    return probs


def classification_metrics(rows: list[LabelledText], probs: torch.Tensor) -> dict:
    """Accuracy and F1 (positive class and macro) overall and per source dataset."""
    pred = probs.argmax(-1).tolist()
    groups: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        groups["all"].append(i)
        groups[row.source].append(i)
    out = {}
    for name, idx in sorted(groups.items()):
        y = [rows[i].label for i in idx]
        p = [pred[i] for i in idx]
        out[name] = {"n": len(idx), "accuracy": round(sum(a == b for a, b in zip(y, p)) / len(idx), 4)}
        f1s = []
        for cls in (1, 0):
            tp = sum(a == cls and b == cls for a, b in zip(y, p))
            fp = sum(a != cls and b == cls for a, b in zip(y, p))
            fn = sum(a == cls and b != cls for a, b in zip(y, p))
            f1s.append(2 * tp / max(1, 2 * tp + fp + fn))
        out[name]["f1_positive"] = round(f1s[0], 4)
        out[name]["f1_macro"] = round(sum(f1s) / 2, 4)
    return out


def run(
    data_dir: Path,
    out_dir: Path,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    vocab_size: int = 8000,
    max_tokens: int = 128,
    state_path: Path | None = None,
    limit: int | None = None,
    command: str = "",
    cjk_chars: bool = True,
    pretrain_minutes: float = 0.0,
    token_dropout: float = 0.0,
    negation_templates: bool = False,
    mined_negations: bool = False,
    distill: float = 0.0,
) -> dict:
    """Train and evaluate; write the checkpoint folder; return the metrics."""
    train_rows, dev_rows, test_rows = sentiment_splits(data_dir, train_cfg.seed)
    if limit:
        train_rows, dev_rows, test_rows = train_rows[:limit], dev_rows[: limit // 4], test_rows[: limit // 4]
    reviews = train_rows  # the templates, and the mined clauses, are appended after them
    n_templates = 0
    if negation_templates:
        synthetic = negation_examples(exclude={text for _, text in NEGATION_PROBES})
        n_templates = len(synthetic)
        train_rows = train_rows + synthetic
    teacher = None
    if distill > 0 or mined_negations:  # fitted once: the mining and the teacher's dev/test report read it
        from export.training import ngram_teacher

        teacher = ngram_teacher.fit([r.text for r in reviews], [r.label for r in reviews])
    n_mined = 0
    if mined_negations:  # appended after the templates: like them, they keep their own labels
        from export.training import negation_mining

        mined = negation_mining.mine(reviews, teacher, exclude={text for _, text in NEGATION_PROBES})
        n_mined = len(mined)
        print(f"mined negated clauses: {n_mined} ({sum(r.label for r in mined)} positive)")
        train_rows = train_rows + mined
    print(f"sentiment: train {len(train_rows)}, dev {len(dev_rows)}, test {len(test_rows)}")

    tokenizer = train_or_resume(
        Path(state_path).parent / TOKENIZER_FILE if state_path else None,
        lambda: train_tokenizer((r.text for r in train_rows), vocab_size, cjk_chars=cjk_chars),
    )
    model_cfg.vocab_size = tokenizer.get_vocab_size()
    model_cfg.num_labels = len(LABELS)
    ids = {
        name: encode(tokenizer, [r.text for r in part], max_tokens)
        for name, part in [("train", train_rows), ("dev", dev_rows), ("test", test_rows)]
    }
    labels = torch.tensor([r.label for r in train_rows])
    targets = F.one_hot(labels, len(LABELS)).float()  # the labels, or mixed with the teacher's probabilities
    teacher_report: dict = {}
    if distill > 0:  # the template rows and mined clauses after the reviews keep their labels
        probs, teacher_report = teacher_probabilities(reviews, dev_rows, test_rows, teacher)
        targets[: len(reviews)] = (1 - distill) * targets[: len(reviews)] + distill * probs
        teacher_report["weight"] = distill
    model = SentimentClassifier(model_cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters, vocab {model_cfg.vocab_size}")

    unlabeled = [x for x in ids["train"] if x]
    history_mlm: dict = {}
    if pretrain_minutes > 0:
        mlm_cfg = replace(train_cfg, max_minutes=pretrain_minutes, max_epochs=100)

        def mlm_loss_fn(m: nn.Module, batch: list[int]) -> torch.Tensor:
            x, mask = pad_batch([unlabeled[i] for i in batch])
            inputs, targets = mask_tokens(x, mask, model_cfg.vocab_size)
            return m(inputs, mask, targets)

        print(f"pre-training the encoder (masked tokens) on {len(unlabeled)} texts for {pretrain_minutes} min")
        history_mlm = train(
            MaskedLanguageModel(model.encoder),
            [len(x) for x in unlabeled],
            mlm_loss_fn,
            mlm_cfg,
            state_path=None,
            desc="pretrain",
        )
        train_cfg = replace(train_cfg, max_minutes=train_cfg.max_minutes - history_mlm["minutes"])

    def loss_fn(m: nn.Module, batch: list[int]) -> torch.Tensor:
        x, mask = pad_batch([ids["train"][i] or [0] for i in batch])
        return F.cross_entropy(m(drop_tokens(x, mask, token_dropout), mask), targets[batch], label_smoothing=0.05)

    def evaluate(m: nn.Module) -> dict[str, float]:
        return {"dev_accuracy": classification_metrics(dev_rows, predict(m, ids["dev"]))["all"]["accuracy"]}

    history = train(model, [len(x) for x in ids["train"]], loss_fn, train_cfg, evaluate, "dev_accuracy", state_path)
    round_to_stored_precision(model)
    metrics = {
        "task": "sentiment",
        "command": command,
        "parameters": n_params,
        "negation_templates": n_templates,
        "mined_negations": n_mined,
        "splits": {"train": len(train_rows), "dev": len(dev_rows), "test": len(test_rows), "seed": train_cfg.seed},
        "dev": classification_metrics(dev_rows, predict(model, ids["dev"])),
        "test": classification_metrics(test_rows, predict(model, ids["test"])),
        "negation_probes": probe_report(model, tokenizer, max_tokens),
        "history": history,
        "pretraining": history_mlm,
        "teacher": teacher_report,
    }
    config = {
        "task": "sentiment",
        "architecture": "SentimentClassifier",
        "model": asdict(model_cfg),
        "labels": LABELS,
        "max_tokens": max_tokens,
        "tokenizer": "chars" if cjk_chars else "words",
    }
    save_checkpoint(out_dir, model, config, metrics)
    tokenizer.save(str(Path(out_dir) / TOKENIZER_FILE))
    print(f"test accuracy {metrics['test']['all']['accuracy']:.4f} → {out_dir}")
    return metrics


def probe_report(model: nn.Module, tokenizer, max_tokens: int) -> dict:
    """How many negation probes the model labels right, and each one's label and P(label)."""
    texts = [text for _, text in NEGATION_PROBES]
    probs = predict(model, encode(tokenizer, texts, max_tokens))
    answers = [
        (want, LABELS[int(p.argmax())], round(float(p.max()), 4)) for (want, _), p in zip(NEGATION_PROBES, probs)
    ]
    right = sum(want == got for want, got, _ in answers)
    print(f"negation probes: {right}/{len(texts)} right")
    return {"right": right, "of": len(texts), "answers": {t: [got, p] for t, (_, got, p) in zip(texts, answers)}}


def teacher_probabilities(
    train_rows: list[LabelledText], dev_rows: list[LabelledText], test_rows: list[LabelledText], teacher
) -> tuple[torch.Tensor, dict]:
    """The n-gram teacher's out-of-fold class probabilities [N, 2] for the training rows, and a report
    of its own accuracy (out of fold on train; for dev and test, `teacher`: ngram_teacher.fit on train_rows)."""
    from export.training import ngram_teacher

    texts, y = [r.text for r in train_rows], [r.label for r in train_rows]
    print(f"n-gram teacher: out-of-fold probabilities for {len(texts)} training texts")
    probs = torch.from_numpy(ngram_teacher.out_of_fold_probabilities(texts, y))
    accuracy = {"train_out_of_fold": round(float((probs.argmax(-1) == torch.tensor(y)).float().mean()), 4)}
    for name, rows in (("dev", dev_rows), ("test", test_rows)):
        accuracy[name] = round(float((teacher.predict([r.text for r in rows]) == [r.label for r in rows]).mean()), 4)
    print(f"n-gram teacher accuracy: {accuracy}")
    return probs, {"model": "tf-idf char 1-3-grams + logistic regression", "accuracy": accuracy}


def load(checkpoint_dir: Path) -> tuple[SentimentClassifier, dict, object]:
    """(model in eval mode, config dict, tokenizer) from a checkpoint folder."""
    config = read_json(Path(checkpoint_dir) / CONFIG_FILE)
    model = SentimentClassifier(ModelConfig.from_dict(config["model"]))
    load_weights(checkpoint_dir, model)
    return model, config, load_tokenizer(Path(checkpoint_dir) / TOKENIZER_FILE)
