"""`sentiment`: texts → the encoder, one call per length bucket → softmax → label and score.

The endpoint runs its copy of the encoder graph in-process (`encoder.onnx` in its version folder, written by
export.build_repository:encoder_copy): a BLS call to the `sentiment_encoder` model would cost a round trip
through Triton and a second Python stub per call, which is most of what the endpoint spends beyond the encoder
itself (BENCHMARKS.md). Without that file (the explain twin) it calls the model by BLS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from serving.frontends.base import BatchTokenizer, Encoded, FrontModel, length_buckets

IN_PROCESS_ENCODER = "encoder.onnx"


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
        graph = self.asset_dir / IN_PROCESS_ENCODER
        self.session = in_process_session(graph, self.graph_threads()) if graph.is_file() else None

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
        feeds = {"input_ids": batch.ids, "attention_mask": batch.mask}
        if self.session is not None:
            (logits,) = self.session.run(["logits"], feeds)
        else:
            logits = self.bls(self.encoder, feeds, ["logits"])["logits"]
        return label_and_score(logits, self.labels)


def in_process_session(path: Path, threads: int) -> Any:
    """An ONNX Runtime session for a graph the front model runs itself; CUDA where this onnxruntime has it."""
    import onnxruntime as ort

    from export.providers import inference_session

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Each instance is one caller; spinning threads would only take the core from the other instance.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return inference_session(path, options)
