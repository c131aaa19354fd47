"""`sentiment`: texts → BLS calls to the task's `encoder` model, one per length bucket → softmax → label and score."""

from __future__ import annotations

from typing import Any

import numpy as np

from serving.frontends.base import BatchTokenizer, Encoded, FrontModel, length_buckets


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def label_and_score(logits: np.ndarray, labels: list[str]) -> list[tuple[str, float]]:
    probs = softmax(logits.astype(np.float64))
    best = probs.argmax(axis=-1)
    return [(labels[k], float(probs[i, k])) for i, k in enumerate(best)]


class SentimentFront(FrontModel):
    def __init__(self, pb: Any, args: dict) -> None:
        super().__init__(pb, args)
        self.encoder = self.models["encoder"]
        self.labels: list[str] = self.task_config["labels"]
        self.tokenizer = BatchTokenizer.from_file(self.asset_dir / "tokenizer.json", self.task_config["max_tokens"])

    def run_group(self, texts: list[str], options: tuple) -> list[tuple]:
        """One tokenizer call for the batch, then one encoder call per length bucket (less padding)."""
        batch = self.encode(self.tokenizer, texts)
        results: list[Any] = [None] * len(texts)
        for rows in length_buckets(batch.lengths):
            for row, result in zip(rows, self.classify(batch.take(rows))):
                results[row] = result
        return results

    def classify(self, batch: Encoded) -> list[tuple[str, float]]:
        """(label, score) per row of an encoded batch: one call of the fast encoder."""
        logits = self.bls(self.encoder, {"input_ids": batch.ids, "attention_mask": batch.mask}, ["logits"])["logits"]
        return label_and_score(logits, self.labels)
