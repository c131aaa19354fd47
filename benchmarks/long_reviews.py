"""Long reviews: how `sentiment` should pool the windows of a text longer than the encoder reads.

Takes the test reviews (and, as a check, the dev reviews) longer than the encoder's max_tokens, reads each in
sentence-aligned windows exactly as the front model does (serving/frontends/windows.py), runs every window through
the served encoder graph in ONNX Runtime, and scores every pooling of :data:`serving.frontends.windows.POOLINGS`
against "truncated": the first max_tokens tokens only, what the endpoint read before windows. Also scores one
hotel review written for the purpose (eight sentences praising the location, then the verdict on the service).

    python -m benchmarks.long_reviews --data-dir ../shared/data   # → benchmarks/results/long_reviews.json

CPU only and about a minute on two cores; no server.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.stats import cpu_flags
from export.training.data import DEFAULT_DATA_DIR, sentiment_splits
from serving.frontends.base import length_buckets, pad_rows
from serving.frontends.sentiment import ENCODER_ROWS, POOLING, label_and_score
from serving.frontends.windows import POOLINGS, pool, window_rows

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "model_repository" / "sentiment" / "1"
RESULT = ROOT / "benchmarks" / "results" / "long_reviews.json"
TODAY = "truncated"  # the first max_tokens tokens, as the endpoint read a text before windows

# A review whose verdict comes after its window: eight sentences about the location, then the service.
HOTEL_PRAISE = (
    "酒店的位置非常好，就在地铁站出口旁边，出门走两分钟就到。",
    "周围有很多餐馆和小吃店，吃饭特别方便，选择也很多。",
    "离市中心的商业街很近，步行十分钟就能到，逛街购物很方便。",
    "附近有一个很大的公园，早上可以去湖边散步跑步，空气很好。",
    "去火车站和机场都很方便，打车二十分钟左右就到了。",
    "酒店对面就有超市和便利店，买水果和日用品都很方便。",
    "周边的景点也很多，博物馆和老街走路就能到。",
    "总之，这家酒店的地理位置没得说，交通非常便利。",
)
HOTEL_VERDICT = "可是前台的服务太差了，态度恶劣，办个入住等了一个多小时，我再也不会来了！"
HOTEL_REVIEW = "".join(HOTEL_PRAISE) + HOTEL_VERDICT


class Encoder:
    """The served sentiment encoder graph and tokenizer, called as the front model calls them."""

    def __init__(self, folder: Path, threads: int) -> None:
        from tokenizers import Tokenizer

        from serving.providers import in_process_session

        self.config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.window = int(self.config["max_tokens"])
        self.labels: list[str] = self.config["labels"]
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.session = in_process_session(folder / "encoder.onnx", threads)  # the front model's own session

    def logits(self, rows: list[list[int]]) -> np.ndarray:
        """Logits [rows, labels]: padded and bucketed by length as serving/frontends/sentiment.py does."""
        batch = pad_rows(rows)
        out = np.zeros((len(rows), len(self.labels)), dtype=np.float32)
        for bucket in length_buckets(batch.lengths):
            for at in range(0, len(bucket), ENCODER_ROWS):
                part = bucket[at : at + ENCODER_ROWS]
                taken = batch.take(part)
                (out[part],) = self.session.run(["logits"], {"input_ids": taken.ids, "attention_mask": taken.mask})
        return out

    def answers(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """Per text, its logits [C] under every pooling and under truncation (``TODAY``)."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        read = window_rows(texts, encodings, self.window)
        logits = self.logits(read.rows)
        truncated = self.logits([enc.ids[: self.window] or [0] for enc in encodings])
        per_text: list[list[int]] = [[] for _ in texts]
        for row, owner in enumerate(read.owners):
            per_text[owner].append(row)
        lengths = [len(row) for row in read.rows]
        answers = {TODAY: truncated.astype(np.float64)}
        for how in POOLINGS:
            answers[how] = np.stack([pool(logits[rows], [lengths[r] for r in rows], how) for rows in per_text])
        answers["windows"] = np.array([len(rows) for rows in per_text])
        return answers


def score(folder: Path, data_dir: Path, seed: int, threads: int) -> dict[str, Any]:
    encoder = Encoder(folder, threads)
    splits = dict(zip(("train", "dev", "test"), sentiment_splits(data_dir, seed), strict=True))
    result: dict[str, Any] = {
        "window": encoder.window,
        "pooling_served": POOLING,
        "poolings": [TODAY, *POOLINGS],
        "splits": {},
    }
    for split in ("test", "dev"):
        rows = splits[split]
        counts = [len(e.ids) for e in encoder.tokenizer.encode_batch([r.text for r in rows], add_special_tokens=False)]
        long = [r for r, n in zip(rows, counts, strict=True) if n > encoder.window]
        answers = encoder.answers([r.text for r in long])
        labels = np.array([r.label for r in long])
        sets: dict[str, Any] = {}
        for name in ["all", *sorted({r.source for r in long})]:
            chosen = np.array([name in ("all", r.source) for r in long])
            n = int(chosen.sum())
            accuracy = {
                how: float((answers[how][chosen].argmax(axis=-1) == labels[chosen]).mean())
                for how in result["poolings"]
            }
            right = {how: answers[how][chosen].argmax(axis=-1) == labels[chosen] for how in result["poolings"]}
            sets[name] = {
                "reviews": n,
                "of": sum(name in ("all", r.source) for r in rows),
                "mean_windows": round(float(answers["windows"][chosen].mean()), 2),
                "accuracy": {k: round(v, 4) for k, v in accuracy.items()},
                # paired: reviews each pooling gets right that the served one gets wrong, and the other way round
                "vs_served": {
                    how: [int((right[how] & ~right[POOLING]).sum()), int((~right[how] & right[POOLING]).sum())]
                    for how in result["poolings"]
                    if how != POOLING
                },
                # binomial standard error of an accuracy near the truncated one: what counts as noise here
                "standard_error": round(math.sqrt(max(accuracy[TODAY] * (1 - accuracy[TODAY]), 1e-9) / n), 4),
            }
        result["splits"][split] = sets
    example = encoder.answers([HOTEL_REVIEW])
    tokens = len(encoder.tokenizer.encode(HOTEL_REVIEW, add_special_tokens=False).ids)
    verdict_starts = len(encoder.tokenizer.encode("".join(HOTEL_PRAISE), add_special_tokens=False).ids)
    result["hotel_review"] = {
        "text": HOTEL_REVIEW,
        "tokens": tokens,
        "verdict_starts_at_token": verdict_starts,
        "windows": int(example["windows"][0]),
        "answers": {
            how: dict(zip(("label", "score"), label_and_score(example[how], encoder.labels)[0], strict=True))
            for how in result["poolings"]
        },
    }
    return result


def table(result: dict[str, Any]) -> str:
    """The accuracies as a markdown table, one row per split and set, one column per pooling."""
    poolings = result["poolings"]
    lines = [
        "| split | set | long reviews | windows (mean) | " + " | ".join(poolings) + " |",
        "|---|---|---|---|" + "---|" * len(poolings),
    ]
    for split, sets in result["splits"].items():
        for name, s in sets.items():
            best = max(s["accuracy"].values())
            cells = [
                f"**{100 * s['accuracy'][p]:.1f}**" if s["accuracy"][p] == best else f"{100 * s['accuracy'][p]:.1f}"
                for p in poolings
            ]
            lines.append(
                f"| {split} | {name} | {s['reviews']} of {s['of']:,} | {s['mean_windows']} | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(lines)


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return next((x.partition(":")[2].strip() for x in cpuinfo if x.startswith("model name")), "")
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.long_reviews", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="public datasets root")
    parser.add_argument("--model", type=Path, default=MODEL, help="the sentiment front model's version folder")
    parser.add_argument("--seed", type=int, default=13, help="the split's seed (the training default)")
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    parser.add_argument("--out", type=Path, default=RESULT, help="where the JSON result goes")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    result = {
        "command": "python -m benchmarks.long_reviews " + " ".join(argv if argv is not None else sys.argv[1:]),
        **score(args.model, args.data_dir, args.seed, args.threads),
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
    }
    result["seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    print(table(result))
    hotel = result["hotel_review"]
    print(
        f"\nhotel review ({hotel['tokens']} tokens, verdict from token {hotel['verdict_starts_at_token']}, "
        f"{hotel['windows']} windows): "
        + ", ".join(f"{how} {a['label']} {a['score']:.2f}" for how, a in hotel["answers"].items())
    )
    print(f"→ {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
