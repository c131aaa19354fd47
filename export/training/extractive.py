"""Extractive summaries: an encoder scores every token of the text, a span's score is the mean over its tokens,
and the best-scoring span (serving/text/spans.py) is the headline.

The encoder starts from the summarize checkpoint's encoder (same tokenizer, already trained on LCSTS texts) and
learns, on LCSTS, to rank each text's spans by how much of the reference headline they hold: the target is a
softmax over the spans' character ROUGE-L F (temperature TEMPERATURE), the loss the cross-entropy against the
softmax of the span scores. The input is [bos] + text + [eos]: with RoPE's relative positions the start and end
tokens are how the encoder knows where in the text a span sits (headlines favour the lead).

`python -m export.train summarize --extractive` trains it into checkpoints/summarize/extractor/ (a checkpoint
folder of its own: config.json, model.safetensors, metrics.json, tokenizer.json); the summarize front model
runs its ONNX export for MODE = "extractive".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from export.model.checkpoint import CONFIG_FILE, load_weights, read_json, round_to_stored_precision, save_checkpoint
from export.model.config import ModelConfig
from export.model.transformer import Encoder, _init_weights
from export.training.data import Pair, read_summarization, seeded_split
from export.training.loop import TrainConfig, length_batches, pad_batch, train
from export.training.scores import lead_baseline, rouge_chars, rouge_l
from serving.text.spans import Candidates, candidates
from serving.text.tokenizer import load_tokenizer

TEMPERATURE = 0.05  # on ROUGE-L F in [0, 1]: a span 0.1 better gets e² ≈ 7 times the target weight
EXTRACTOR_FOLDER = "extractor"  # inside the summarize checkpoint
TOKENIZER_FILE = "tokenizer.json"


class SpanScorer(nn.Module):
    """Encoder + linear head: ids [B, S], mask [B, S] → one score per token [B, S]."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.head = nn.Linear(cfg.d_model, 1)
        self.head.apply(_init_weights)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.head(self.encoder(input_ids, attention_mask)).squeeze(-1)


@dataclass
class Example:
    candidates: Candidates
    gains: list[float]  # per candidate span, ROUGE-L F against the reference (0 when there is none)


def make_example(text: str, tokenizer: Tokenizer, max_tokens: int, reference: str = "") -> Example:
    """The text's candidate spans and model input, exactly as the summarize front model builds them."""
    enc = tokenizer.encode(text, add_special_tokens=False)
    spans = candidates(text, enc.ids, enc.offsets, max_tokens)
    return Example(spans, [rouge_l(t, reference) if reference else 0.0 for t in spans.texts])


def span_logits(scores: Tensor, examples: list[Example]) -> Tensor:
    """[B, K] mean token score of each candidate span (-inf where a text has fewer than K spans)."""
    k = max(len(e.candidates.positions) for e in examples)
    pooling = torch.zeros(len(examples), k, scores.shape[1])
    present = torch.zeros(len(examples), k, dtype=torch.bool)
    for b, example in enumerate(examples):
        for j, positions in enumerate(example.candidates.positions):
            pooling[b, j, positions] = 1.0 / len(positions)
            present[b, j] = True
    logits = torch.einsum("bks,bs->bk", pooling, scores.float())
    return logits.masked_fill(~present, float("-inf"))


def ranking_loss(model: nn.Module, examples: list[Example]) -> Tensor:
    ids, mask = pad_batch([e.candidates.ids for e in examples])
    logits = span_logits(model(ids, mask), examples)
    gains = torch.full_like(logits, float("-inf"))
    for b, example in enumerate(examples):
        gains[b, : len(example.gains)] = torch.tensor(example.gains) / TEMPERATURE
    target = gains.softmax(-1)
    log_p = logits.log_softmax(-1).masked_fill(torch.isinf(logits), 0.0)
    return -(target * log_p).sum(-1).mean()


@torch.no_grad()
def pick(model: nn.Module, examples: list[Example], batch_tokens: int = 8192) -> list[str]:
    """The best span of each text."""
    model.eval()
    out = [""] * len(examples)
    for batch in length_batches([len(e.candidates.ids) for e in examples], batch_tokens, 128, None):
        ids, mask = pad_batch([examples[i].candidates.ids for i in batch])
        logits = span_logits(model(ids, mask), [examples[i] for i in batch])
        for i, best in zip(batch, logits.argmax(-1).tolist(), strict=True):
            out[i] = examples[i].candidates.texts[best]
    return out


def run(
    data_dir: Path,
    out_dir: Path,
    init: Path,
    train_cfg: TrainConfig,
    state_path: Path | None = None,
    limit: int | None = None,
    command: str = "",
) -> dict:
    """Train the scorer from the encoder of the summarize checkpoint in `init`; write the checkpoint folder."""
    from export.training import seq2seq

    generator, generator_config, tokenizer, _ = seq2seq.load(init)
    cfg = ModelConfig.from_dict({**generator_config["model"], "n_decoder_layers": 0, "copy": False})
    max_tokens = generator_config["max_tokens"]
    model = SpanScorer(cfg)
    model.encoder.load_state_dict(generator.encoder.state_dict())

    pairs, test_pairs = read_summarization(data_dir)
    train_pairs, dev_pairs = seeded_split(pairs, key=lambda p: p.source, fractions=(0.95, 0.05))
    if limit:
        train_pairs, dev_pairs, test_pairs = train_pairs[:limit], dev_pairs[: limit // 4], test_pairs[: limit // 4]
    print(f"extractive summarize: train {len(train_pairs)}, dev {len(dev_pairs)}, test {len(test_pairs)}")

    def build(part: list[Pair]) -> list[Example]:
        return [make_example(p.source, tokenizer, max_tokens, p.target) for p in part]

    train_ex, dev_ex, test_ex = build(train_pairs), build(dev_pairs), build(test_pairs)

    def evaluate(m: nn.Module) -> dict[str, float]:
        return {"dev_rougeL": rouge_chars(pick(m, dev_ex), [p.target for p in dev_pairs])["rougeL"]}

    history = train(
        model,
        [len(e.candidates.ids) for e in train_ex],
        lambda m, batch: ranking_loss(m, [train_ex[i] for i in batch]),
        train_cfg,
        evaluate,
        "dev_rougeL",
        state_path,
    )
    round_to_stored_precision(model)
    metrics = {
        "task": "summarize",
        "mode": "extractive",
        "command": command,
        "parameters": sum(p.numel() for p in model.parameters()),
        "initialised_from": str(init),
        "splits": {"train": len(train_pairs), "dev": len(dev_pairs), "test": len(test_pairs), "seed": train_cfg.seed},
        "dev": scores(model, dev_ex, dev_pairs),
        "test": scores(model, test_ex, test_pairs),
        "history": history,
    }
    print({k: metrics[k] for k in ("dev", "test")})
    config = {
        "task": "summarize",
        "architecture": "SpanScorer",
        "model": asdict(cfg),
        "max_tokens": max_tokens,
        "temperature": TEMPERATURE,
    }
    save_checkpoint(out_dir, model, config, metrics)
    tokenizer.save(str(Path(out_dir) / TOKENIZER_FILE))
    return metrics


def scores(model: nn.Module, examples: list[Example], pairs: list[Pair]) -> dict:
    """The scorer's picks next to the lead baselines and the best possible pick, all as character ROUGE."""
    from export.training.seq2seq import first_sentence

    references = [p.target for p in pairs]
    texts = [p.source for p in pairs]
    best = [e.candidates.texts[max(range(len(e.gains)), key=e.gains.__getitem__)] for e in examples]
    return {
        "extractive": rouge_chars(pick(model, examples), references),
        "lead_baseline": rouge_chars(lead_baseline(texts, references), references),
        "first_sentence_baseline": rouge_chars([first_sentence(t) for t in texts], references),
        "oracle_span": rouge_chars(best, references),
    }


def load(folder: Path) -> tuple[SpanScorer, dict, Tokenizer]:
    """(scorer in eval mode, config dict, tokenizer) from an extractor checkpoint folder."""
    config = read_json(Path(folder) / CONFIG_FILE)
    model = SpanScorer(ModelConfig.from_dict(config["model"]))
    load_weights(folder, model)
    return model, config, load_tokenizer(Path(folder) / TOKENIZER_FILE)
