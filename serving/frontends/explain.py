"""`translate_explain` and `sentiment_explain`: the public endpoints' answers plus what the model attended to.

Same input contract and validation as `translate` / `sentiment` (the shared flow of `base.FrontModel`),
same answers (the same fast models produce them), plus tokens and attention matrices from the explain
ONNX models of export/graphs/explain_export.py:

translate_explain  TEXT (+ MAX_NEW_TOKENS, NUM_BEAMS; one sentence per text unless SPLIT_SENTENCES=0)
                   → TRANSLATION [N, 1]; SOURCE_TOKENS [N, S]; TARGET_TOKENS [N, T]; ATTENTION [N, L, T, S]:
                   per decoder layer, head-averaged cross-attention, row t = the source tokens attended to
                   while producing target token t.
                   The translation comes from `translate_generator` with the request's settings (so it is
                   `translate`'s), then `translate_attention` re-reads it with teacher forcing. The target
                   tokens end with [EOS] when the model stopped by itself (not cut by MAX_NEW_TOKENS).
sentiment_explain  TEXT → LABEL, SCORE [N, 1] (from `sentiment_encoder`, as `sentiment`); TOKENS [N, S];
                   ATTENTION [N, L, S, S]: per encoder layer, head-averaged self-attention; ROLLOUT [N, S]:
                   attention rollout (Abnar & Zuidema 2020) from the mean-pooled position the classifier
                   reads, i.e. the share of each input token in what the head sees.

A request of several texts of different lengths is padded to its longest: tokens with "" and matrices
with 0. A text's real lengths are its counts of non-empty tokens; every real attention row sums to 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from serving.frontends.base import Encoded, InputError, to_column
from serving.frontends.beam_search_op import BeamSearchOpFront
from serving.frontends.options import NoOptions, TranslateOptions
from serving.frontends.sentences import split
from serving.frontends.sentiment import SentimentFront
from serving.text.tokenizer import BOS_ID, EOS_ID, PAD_ID, detokenize


def pad_tokens(rows: Sequence[Sequence[str]]) -> np.ndarray:
    """Token lists → BYTES [N, longest], right-padded with empty strings."""
    width = max(len(row) for row in rows)
    out = np.full((len(rows), width), b"", dtype=np.object_)
    for i, row in enumerate(rows):
        out[i, : len(row)] = [token.encode("utf-8") for token in row]
    return out


def pad_arrays(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Same-rank arrays of different sizes → one float32 array [N, *largest], zero-padded at the ends."""
    shape = np.max([a.shape for a in arrays], axis=0)
    out = np.zeros((len(arrays), *shape), dtype=np.float32)
    for i, a in enumerate(arrays):
        out[(i, *(slice(0, n) for n in a.shape))] = a
    return out


def pack_column(values: Sequence[Any], dtype: Any) -> np.ndarray:
    """One output tensor from one value per text: arrays and token lists are padded, scalars make [N, 1]."""
    if isinstance(values[0], np.ndarray):
        return pad_arrays(values)
    if isinstance(values[0], list | tuple):
        return pad_tokens(values)
    return to_column(values, dtype)


def attention_rollout(layers: np.ndarray) -> np.ndarray:
    """Per-layer attention [L, S, S] (rows sum to 1) → rollout [S, S]: how much of each input token
    reaches each position through all layers, counting the residual connection as half of the mix
    (Â = ½A + ½I, R = Â_L ··· Â_1). Rows still sum to 1."""
    size = layers.shape[-1]
    rollout = np.eye(size, dtype=np.float64)
    for attention in layers:
        rollout = (0.5 * attention + 0.5 * np.eye(size)) @ rollout
    return rollout


def pooled_rollout(layers: np.ndarray) -> np.ndarray:
    """Rollout from the classifier's mean-pooled position: the mean of the rollout's rows, [S], sums to 1."""
    return attention_rollout(layers).mean(axis=0).astype(np.float32)


def token_strings(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    return [tokenizer.id_to_token(int(i)) or "[UNK]" for i in ids]


class PaddedOutputs:
    """Mixin: responses whose outputs may be token lists or matrices of per-text size (see pack_column)."""

    pb: Any
    outputs: tuple[str, ...]

    def ok_response(self, rows: list[tuple]) -> Any:
        tensors = [
            self.pb.Tensor(name, pack_column(values, self.output_dtype(name)))
            for name, values in zip(self.outputs, zip(*rows))
        ]
        return self.pb.InferenceResponse(output_tensors=tensors)


def target_rows(generated: list[list[int]], new_tokens: int) -> list[list[int]]:
    """The target tokens to explain: the generated ones, plus eos where the model ended the output itself
    (fewer tokens than allowed). Row t of the attention belongs to target token t."""
    return [tokens + [EOS_ID] if len(tokens) < new_tokens else tokens for tokens in generated]


def decoder_inputs(targets: list[list[int]]) -> np.ndarray:
    """Teacher forcing input int32 [B, T]: bos then each target but the last, right-padded."""
    width = max(len(t) for t in targets)
    out = np.full((len(targets), width), PAD_ID, dtype=np.int32)
    for i, tokens in enumerate(targets):
        row = [BOS_ID, *tokens[:-1]]
        out[i, : len(row)] = row
    return out


class TranslateExplainFront(PaddedOutputs, BeamSearchOpFront):
    """`translate`'s generation, then one teacher-forced pass of the explain model over the result."""

    Options = TranslateOptions

    def __init__(self, pb: Any, args: dict) -> None:
        super().__init__(pb, args)
        self.explainer = self.models["explainer"]

    def read_request(self, request: Any) -> tuple[list[str], TranslateOptions]:
        """As every front model, and a text `translate` would read as several sentences is refused: its attention
        is one matrix per text read whole, which is not what `translate` answers for it."""
        texts, options = super().read_request(request)
        for i, text in enumerate(texts):
            count = len(split(text, options.split_sentences).pieces)
            if count > 1:
                raise InputError(
                    f"TEXT[{i}] holds {count} sentences; translate_explain explains one sentence per text: send "
                    "them as texts of their own, or SPLIT_SENTENCES=0 to explain the text read whole",
                    "invalid_input",
                )
        return texts, options

    def run_group(self, texts: list[str], options: TranslateOptions) -> list[tuple]:
        batch, generated = self.generate(texts, options)
        targets = target_rows(generated, new_tokens=options.max_new_tokens)
        feeds = {
            "input_ids": batch.ids.astype(np.int32),
            "attention_mask": batch.mask.astype(np.int32),
            "decoder_input_ids": decoder_inputs(targets),
        }
        cross = self.bls(self.explainer, feeds, ["cross_attention"])["cross_attention"]  # [B, L, T, S]
        rows = []
        for i, (tokens, target) in enumerate(zip(generated, targets)):
            source_len = batch.lengths[i]
            rows.append(
                (
                    detokenize(self.target, tokens),
                    token_strings(self.source.tokenizer, batch.ids[i, :source_len]),
                    token_strings(self.target, target),
                    cross[i, :, : len(target), :source_len],
                )
            )
        return rows


class SentimentExplainFront(PaddedOutputs, SentimentFront):
    """`sentiment`'s label and score, plus the explain encoder's self-attention and its rollout."""

    def __init__(self, pb: Any, args: dict) -> None:
        super().__init__(pb, args)
        self.explainer = self.models["explainer"]

    def run_group(self, texts: list[str], options: NoOptions) -> list[tuple]:
        batch = self.encode(self.tokenizer, texts)
        verdicts = self.classify(batch)
        attention = self.attention(batch)  # [B, L, S, S]
        rows = []
        for i, (label, score) in enumerate(verdicts):
            n = batch.lengths[i]
            layers = attention[i, :, :n, :n]
            tokens = token_strings(self.tokenizer.tokenizer, batch.ids[i, :n])
            rows.append((label, score, tokens, layers, pooled_rollout(layers)))
        return rows

    def attention(self, batch: Encoded) -> np.ndarray:
        feeds = {"input_ids": batch.ids, "attention_mask": batch.mask}
        return self.bls(self.explainer, feeds, ["attention"])["attention"]
