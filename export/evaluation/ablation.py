"""Positional-encoding ablation: which scheme still works on sequences longer than any seen in training?

The seed documents claim that sinusoidal encodings and RoPE extrapolate to longer sequences and
learned absolute encodings do not. We measure it: the same small encoder (export/model/transformer.py) is
trained with each `ModelConfig.positional` scheme, under the same budget (steps, batch, model size,
seeds, data), on sequences of 8–32 tokens, then evaluated on sequences of up to 128 tokens.

Two synthetic token-tagging tasks, because the answer must depend on positions (a bag of words
scores 50%) and their sequences can be made any length:

- `negation` (local order, the seed's 这部电影不差): every polar word is tagged positive or negative,
  flipped when NOT stands right before it. NOT also appears elsewhere, so adjacency matters.
- `order` (long-range order): two markers A and B sit anywhere; A is tagged by whether B comes after it.

The classifier is the served sentiment architecture (`SentimentClassifier`) with its head applied to
every token instead of the pooled state. Results: `<out>/results.json`, `<out>/table.md` and
`<out>/accuracy_vs_length.png`; ABLATION.md discusses them.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from export.model.config import POSITIONAL_SCHEMES, ModelConfig
from export.model.transformer import SentimentClassifier
from export.training.loop import TrainConfig, pad_batch, train

# Vocabulary of the synthetic tasks.
PAD, NOT, MARK_A, MARK_B = 0, 1, 2, 3
POSITIVE = tuple(range(4, 12))
NEGATIVE = tuple(range(12, 20))
FILLER = tuple(range(20, 32))
VOCAB_SIZE = 32
IGNORE = -100  # target of untagged positions (cross_entropy's ignore_index)

Example = tuple[list[int], list[int]]  # (token ids, per-token targets)
Task = Callable[[random.Random, int], Example]


def negation_example(rng: random.Random, length: int) -> Example:
    """Units [NOT polar], [polar], [NOT filler], [filler] until `length`; a polar word's tag is its polarity,
    flipped when NOT is right before it. Negated and plain words are equally likely (position-blind: 50%)."""
    ids: list[int] = []
    while len(ids) < length:
        unit = rng.random()
        if unit < 0.7:  # a polar word, negated half of the time
            ids += ([NOT] if unit < 0.35 else []) + [rng.choice(POSITIVE + NEGATIVE)]
        else:  # filler, after a stray NOT half of the time
            ids += ([NOT] if unit < 0.85 else []) + [rng.choice(FILLER)]
    ids = ids[:length]
    targets = [IGNORE] * length
    for i, tok in enumerate(ids):
        if tok in POSITIVE or tok in NEGATIVE:
            targets[i] = int(tok in POSITIVE) ^ int(i > 0 and ids[i - 1] == NOT)
    return ids, targets


def order_example(rng: random.Random, length: int) -> Example:
    """Filler with markers A and B at two random positions; A is tagged 1 when B comes after it."""
    ids = [rng.choice(FILLER) for _ in range(length)]
    a, b = rng.sample(range(length), 2)
    ids[a], ids[b] = MARK_A, MARK_B
    targets = [IGNORE] * length
    targets[a] = int(b > a)
    return ids, targets


TASKS: dict[str, Task] = {"negation": negation_example, "order": order_example}


@dataclass
class AblationConfig:
    """One budget for every scheme: same model size, steps, batch, data and seeds."""

    tasks: tuple[str, ...] = tuple(TASKS)
    schemes: tuple[str, ...] = ("sinusoidal", "learned", "relative_bias", "rope")
    seeds: tuple[int, ...] = (1, 2, 3)
    steps: int = 800  # optimizer steps per run (batches of `batch_size` sequences)
    batch_size: int = 64
    minutes: float = 0.0  # wall-clock cap per run on top of `steps`; 0 = none (a cap would favour fast schemes)
    train_lengths: tuple[int, int] = (8, 32)  # training sequence lengths, uniform in [lo, hi]
    eval_lengths: tuple[int, ...] = (16, 32, 48, 64, 96, 128)
    eval_examples: int = 512  # sequences per task and length, the same for every scheme and seed
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 256
    lr: float = 2e-3
    threads: int = 1  # on 2 shared cores one thread trained 5x faster than two (measured under load)
    model_extra: dict = field(default_factory=dict)  # further ModelConfig fields (tests use a tiny model)

    def model_config(self, scheme: str) -> ModelConfig:
        return ModelConfig(
            vocab_size=VOCAB_SIZE,
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_layers=self.n_layers,
            d_ff=self.d_ff,
            max_len=max(self.eval_lengths),  # learned: rows past train_lengths[1] exist but are never trained
            dropout=0.0,
            num_labels=2,
            positional=scheme,
            **self.model_extra,
        )


QUICK = AblationConfig(seeds=(1,), steps=30, eval_lengths=(16, 48), eval_examples=64, d_model=32, d_ff=64)


class TokenTagger(nn.Module):
    """The sentiment classifier's encoder and head, applied per token: ids, mask [B, S] → logits [B, S, 2]."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.classifier = SentimentClassifier(cfg)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.classifier.head(self.classifier.encoder(input_ids, attention_mask))


def make_examples(task: Task, n: int, lengths: tuple[int, int], seed: int) -> list[Example]:
    rng = random.Random(seed)
    return [task(rng, rng.randint(*lengths)) for _ in range(n)]


def collate(examples: Sequence[Example]) -> tuple[Tensor, Tensor, Tensor]:
    """ids, mask, targets [B, S], right-padded like the served batches; padding is not tagged."""
    ids, mask = pad_batch([e[0] for e in examples], PAD)
    targets = torch.full_like(ids, IGNORE)
    for row, (_, tags) in enumerate(examples):
        targets[row, : len(tags)] = torch.as_tensor(tags)
    return ids, mask, targets


@torch.no_grad()
def accuracy(model: nn.Module, examples: Sequence[Example], batch_size: int = 128) -> float:
    """Share of tagged positions whose tag the model predicts."""
    model.eval()
    correct = total = 0
    for start in range(0, len(examples), batch_size):
        ids, mask, targets = collate(examples[start : start + batch_size])
        tagged = targets != IGNORE
        correct += int((model(ids, mask).argmax(-1) == targets)[tagged].sum())
        total += int(tagged.sum())
    return correct / max(1, total)


def run_one(cfg: AblationConfig, task_name: str, scheme: str, seed: int, evals: dict[int, list[Example]]) -> dict:
    """Train one scheme on one task with one seed; accuracy per evaluation length."""
    task = TASKS[task_name]
    train_set = make_examples(task, cfg.steps * cfg.batch_size, cfg.train_lengths, seed)
    torch.manual_seed(seed)
    model = TokenTagger(cfg.model_config(scheme))
    train_cfg = TrainConfig(
        max_epochs=1,
        max_minutes=cfg.minutes or 1e9,
        batch_tokens=cfg.batch_size * cfg.train_lengths[1],
        max_batch_size=cfg.batch_size,
        lr=cfg.lr,
        warmup_steps=max(1, cfg.steps // 10),
        seed=seed,
        threads=cfg.threads,
    )

    def loss_fn(m: nn.Module, batch: list[int]) -> Tensor:
        ids, mask, targets = collate([train_set[i] for i in batch])
        return F.cross_entropy(m(ids, mask).flatten(0, 1), targets.flatten(), ignore_index=IGNORE)

    t0 = time.monotonic()
    history = train(model, [len(e[0]) for e in train_set], loss_fn, train_cfg, desc=f"{task_name}/{scheme}/{seed}")
    train_s = time.monotonic() - t0
    return {
        "task": task_name,
        "scheme": scheme,
        "seed": seed,
        "steps": history["epochs"][-1]["step"],
        "train_loss": history["epochs"][-1]["train_loss"],
        "train_seconds": round(train_s, 1),
        "accuracy": {str(n): round(accuracy(model, examples), 4) for n, examples in evals.items()},
    }


def summarize(runs: list[dict]) -> dict:
    """task → scheme → length → mean, sd (over seeds), min, max."""
    grouped: dict = {}
    for run in runs:
        for length, acc in run["accuracy"].items():
            grouped.setdefault(run["task"], {}).setdefault(run["scheme"], {}).setdefault(length, []).append(acc)
    return {
        task: {
            scheme: {
                length: {
                    "mean": round(statistics.fmean(accs), 4),
                    "sd": round(statistics.stdev(accs), 4) if len(accs) > 1 else 0.0,
                    "min": min(accs),
                    "max": max(accs),
                }
                for length, accs in per_length.items()
            }
            for scheme, per_length in per_scheme.items()
        }
        for task, per_scheme in grouped.items()
    }


def markdown_table(summary: dict, train_max: int) -> str:
    """One table per task: schemes × lengths, 'mean ± sd' in percent; lengths past training marked *."""
    out = []
    for task, per_scheme in summary.items():
        lengths = list(next(iter(per_scheme.values())))
        head = [f"{n}{'*' if int(n) > train_max else ''}" for n in lengths]
        out += [f"**{task}** (accuracy %, mean ± sd over seeds; * = longer than any training sequence)", ""]
        out += ["| scheme | " + " | ".join(head) + " |", "|---|" + "---:|" * len(lengths)]
        for scheme, stats in per_scheme.items():
            cells = [f"{100 * stats[n]['mean']:.1f} ± {100 * stats[n]['sd']:.1f}" for n in lengths]
            out.append(f"| {scheme} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def plot(summary: dict, train_max: int, path: Path) -> Path:
    """Accuracy against length, one panel per task, one line per scheme (bars: min–max over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lowest = min(s["min"] for per_scheme in summary.values() for st in per_scheme.values() for s in st.values())
    fig, axes = plt.subplots(1, len(summary), figsize=(5.5 * len(summary), 4), squeeze=False)
    for ax, (task, per_scheme) in zip(axes[0], summary.items()):
        for scheme, stats in per_scheme.items():
            lengths = [int(n) for n in stats]
            mean = [100 * s["mean"] for s in stats.values()]
            low = [100 * (s["mean"] - s["min"]) for s in stats.values()]
            high = [100 * (s["max"] - s["mean"]) for s in stats.values()]
            ax.errorbar(lengths, mean, yerr=[low, high], marker="o", capsize=3, label=scheme)
        ax.axvline(train_max, color="grey", linestyle="--", linewidth=1)
        ax.axhline(50, color="grey", linestyle=":", linewidth=1)
        ax.set(title=f"{task} (trained on lengths ≤ {train_max})", xlabel="sequence length", ylabel="accuracy %")
        ax.set_ylim(min(40, 100 * lowest - 3), 101)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_ablation(cfg: AblationConfig, out_dir: Path) -> dict:
    """Every task × scheme × seed; writes results.json, table.md and accuracy_vs_length.png into out_dir."""
    unknown = [s for s in cfg.schemes if s not in POSITIONAL_SCHEMES] + [t for t in cfg.tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown scheme or task {unknown}: schemes {POSITIONAL_SCHEMES}, tasks {tuple(TASKS)}")
    t0 = time.monotonic()
    runs = []
    jobs = [(t, s, seed) for t in cfg.tasks for seed in cfg.seeds for s in cfg.schemes]
    evals = {
        t: {n: make_examples(TASKS[t], cfg.eval_examples, (n, n), seed=10_000 + n) for n in cfg.eval_lengths}
        for t in cfg.tasks
    }
    for task, scheme, seed in tqdm(jobs, desc="ablation runs", unit="run", dynamic_ncols=True):
        runs.append(run_one(cfg, task, scheme, seed, evals[task]))
    summary = summarize(runs)
    results = {
        "command": "python -m export.evaluation.ablation " + " ".join(sys.argv[1:]),
        "config": asdict(cfg),
        "torch_threads": torch.get_num_threads(),
        "total_minutes": round((time.monotonic() - t0) / 60, 2),
        "runs": runs,
        "summary": summary,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / "table.md").write_text(markdown_table(summary, cfg.train_lengths[1]))
    plot(summary, cfg.train_lengths[1], out_dir / "accuracy_vs_length.png")
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    default = AblationConfig()
    parser = argparse.ArgumentParser(
        prog="python -m export.evaluation.ablation",
        description="Train the same small encoder with each positional scheme (sinusoidal, learned, relative_bias, "
        f"rope) on synthetic tagging tasks with sequences of {default.train_lengths[0]}-{default.train_lengths[1]} "
        f"tokens, evaluate on lengths {', '.join(map(str, default.eval_lengths))}, and write results.json, table.md "
        "and accuracy_vs_length.png. Every scheme gets the same budget: steps, batch, model size, data and seeds.",
    )
    parser.add_argument("--out", type=Path, default=Path("ablation"), help="output folder (default: ablation)")
    parser.add_argument("--tasks", default=",".join(default.tasks), help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--schemes", default=",".join(default.schemes), help="comma-separated positional schemes")
    parser.add_argument("--seeds", type=int, default=len(default.seeds), help="runs per task and scheme (seeds 1..N)")
    parser.add_argument("--steps", type=int, default=default.steps, help="optimizer steps per run (the budget)")
    parser.add_argument(
        "--minutes", type=float, default=0.0, help="optional wall-clock cap per run on top of --steps (0 = none)"
    )
    parser.add_argument("--eval-examples", type=int, default=default.eval_examples, help="sequences per length")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per run (default 1: fastest on busy shared cores)"
    )
    parser.add_argument("--quick", action="store_true", help="a tiny model, 30 steps, 1 seed: checks the pipeline")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = QUICK if args.quick else AblationConfig()
    cfg = replace(
        base,
        tasks=tuple(args.tasks.split(",")),
        schemes=tuple(args.schemes.split(",")),
        threads=args.threads,
        minutes=args.minutes,
    )
    if not args.quick:
        cfg = replace(cfg, seeds=tuple(range(1, args.seeds + 1)), steps=args.steps, eval_examples=args.eval_examples)
    results = run_ablation(cfg, args.out)
    print(markdown_table(results["summary"], cfg.train_lengths[1]))
    print(f"{len(results['runs'])} runs in {results['total_minutes']} min → {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
