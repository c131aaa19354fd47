"""`sentiment`: texts → windows of whole sentences → the encoder, one call per length bucket → pooled per text →
softmax → label and score.

A text longer than the encoder's 128 tokens is read whole, in windows of whole sentences
(serving/frontends/windows.py); the windows' answers are pooled into the text's (:data:`POOLING`, chosen on the
test sets' long reviews: docs/models.md). A text that fits one window is read as one
window of its own tokens: the same answer as a single read.

The endpoint runs its copy of the encoder graph in-process (`encoder.onnx` in its version folder, written by
export.build_repository:encoder_copy): a BLS call to the `sentiment_encoder` model would cost a round trip
through Triton and a second Python stub per call, which is most of what the endpoint spends beyond the encoder
itself (BENCHMARKS.md). Without that file (the explain twin) it calls the model by BLS. With the Triton parameter
`precision` = "int8" (the definition's `precision`) it runs `encoder.int8.onnx` instead.

A model imported from Hugging Face (export/import_hf/bert.py) reads each window between special tokens, [CLS] and
[SEP]: config.json's ``prefix_ids`` and ``suffix_ids``; our encoder has none.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from serving.frontends.base import BatchTokenizer, Encoded, FrontModel, length_buckets, pad_rows
from serving.frontends.options import NoOptions
from serving.frontends.windows import pool, softmax, window_rows
from serving.providers import in_process_session
from serving.text.tokenizer import UNK_ID

IN_PROCESS_ENCODER = "encoder.onnx"
IN_PROCESS_ENCODER_INT8 = "encoder.int8.onnx"
# How a long text's windows are pooled into its answer: the mean of their logits. On the 374 test reviews longer
# than 128 tokens it is right on 85.8% (their first 128 tokens: 84.0%), on the 377 dev ones 91.5% (88.3%);
# weighting windows by their tokens scores as well (87.4% / 90.2%: 11 reviews better, 10 worse), but is not simpler
# (`python -m benchmarks.long_reviews` → benchmarks/results/long_reviews.json; docs/models.md).
POOLING = "mean_logits"
# Rows per encoder call: a request's texts are at most max_batch_size (64) rows; their windows may be many more.
ENCODER_ROWS = 64


def label_and_score(logits: np.ndarray, labels: list[str]) -> list[tuple[str, float]]:
    probs = softmax(logits.astype(np.float64))
    best = probs.argmax(axis=-1)
    return [(labels[k], float(probs[i, k])) for i, k in enumerate(best)]


class SentimentFront(FrontModel):
    # The ids every window is read between (config.json's prefix_ids and suffix_ids): none for our encoder.
    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()

    def __init__(self, pb: Any, args: dict) -> None:
        super().__init__(pb, args)
        self.encoder = self.models.get("encoder", "")  # an imported model has only its in-process graph
        self.labels: list[str] = self.task_config["labels"]
        self.tokenizer = BatchTokenizer.from_file(self.asset_dir / "tokenizer.json", self.task_config["max_tokens"])
        self.prefix = tuple(self.task_config.get("prefix_ids", ()))
        self.suffix = tuple(self.task_config.get("suffix_ids", ()))
        int8 = self.parameters.get("precision", "fp32") == "int8"
        graph = self.asset_dir / (IN_PROCESS_ENCODER_INT8 if int8 else IN_PROCESS_ENCODER)
        if int8 and not graph.is_file():
            raise FileNotFoundError(f"precision is int8 but {graph} is missing")
        self.session = in_process_session(graph, self.graph_threads()) if graph.is_file() else None
        if self.session is None and not self.encoder:
            raise FileNotFoundError(f"{graph} is missing and the definition names no encoder model to call")

    def run_group(self, texts: list[str], options: NoOptions) -> list[tuple]:
        """One tokenizer call for the batch, then one encoder call per length bucket (less padding) over every
        window of every text, then each text's windows pooled."""
        logits, windows, lengths = self.window_logits(texts)
        results: list[tuple[str, float]] = []
        for rows in windows:
            if len(rows) == 1:  # a text that fits one window: its logits as they are
                (result,) = label_and_score(logits[rows], self.labels)
            else:
                pooled = pool(logits[rows], [lengths[r] for r in rows], POOLING)
                (result,) = label_and_score(pooled[None, :], self.labels)
            results.append(result)
        return results

    def window_logits(self, texts: list[str]) -> tuple[np.ndarray, list[list[int]], list[int]]:
        """The encoder's logits [rows, labels] for every window of every text, per text its rows, and each row's
        tokens. Counted in the input-token, truncation and windows-per-text metrics."""
        encodings = self.tokenizer.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        framed = bool(self.prefix or self.suffix)  # a framed row is never empty: an emptied text is just the frame
        read = window_rows(texts, encodings, self.tokenizer.max_tokens, empty=() if framed else (UNK_ID,))
        self.metrics.encoded(read.lengths(), [w.truncated for w in read.windows])
        self.metrics.windows([len(w.bounds) for w in read.windows])
        rows = [[*self.prefix, *row, *self.suffix] for row in read.rows] if framed else read.rows
        batch = pad_rows(rows, self.tokenizer.pad_id)
        logits = np.zeros((len(read.rows), len(self.labels)), dtype=np.float32)
        for bucket in length_buckets(batch.lengths):
            for at in range(0, len(bucket), ENCODER_ROWS):
                rows = bucket[at : at + ENCODER_ROWS]
                logits[rows] = self.encode_rows(batch.take(rows))
        per_text: list[list[int]] = [[] for _ in texts]
        for row, owner in enumerate(read.owners):
            per_text[owner].append(row)
        return logits, per_text, batch.lengths

    def encode_rows(self, batch: Encoded) -> np.ndarray:
        """Logits [B, labels] of an encoded batch: one call of the fast encoder."""
        feeds = {"input_ids": batch.ids, "attention_mask": batch.mask}
        if self.session is not None:
            (logits,) = self.session.run(["logits"], feeds)
            return logits
        return self.bls(self.encoder, feeds, ["logits"])["logits"]

    def classify(self, batch: Encoded) -> list[tuple[str, float]]:
        """(label, score) per row of an encoded batch: one call of the fast encoder."""
        return label_and_score(self.encode_rows(batch), self.labels)
