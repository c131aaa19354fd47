"""`summarize` and `summarize_stream`: the generator's headline (MODE = "abstractive"), or the text's best span
(MODE = "extractive"), picked by the span scorer (the model of role `extractor`, export/training/extractive.py).

Extraction is one BLS call for all texts of a group: the scorer gives every token of [bos] + text + [eos] a score,
a candidate span (serving/text/spans.py, the same cut as in training) scores the mean over its tokens, and the best span
is the answer. The streaming twin sends an extractive answer whole, in one final response.

A text longer than the scorer reads (158 tokens between [bos] and [eos]) is scored in windows of whole sentences
(serving/frontends/windows.py), each [bos] + its tokens + [eos]; a span lies inside one window, and the best span
over all windows is the answer. A text that fits one window is scored as a single read would score it. The
abstractive mode is not windowed: the generator reads the first 159 tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from serving.frontends.base import BatchTokenizer, FrontModel, pad_rows
from serving.frontends.beam_search_op import BeamSearchOpFront
from serving.frontends.engine_front import EngineFront
from serving.frontends.metrics import FrontMetrics
from serving.frontends.options import SummarizeOptions
from serving.frontends.windows import sentence_windows
from serving.text.spans import Candidates, candidates, window_candidates

EXTRACTIVE = "extractive"
# Scorer rows per BLS call: a request's texts are at most max_batch_size (64); their windows may be many more.
SCORER_ROWS = 64


class SpanExtractor:
    """What both summarize front models add: each text's best span, picked by the span scorer. `score(feeds)`
    runs the scorer (the front model's BLS call to its `extractor` model) on input_ids and attention_mask."""

    def __init__(
        self, source: BatchTokenizer, metrics: FrontMetrics, score: Callable[[dict[str, np.ndarray]], np.ndarray]
    ) -> None:
        self.source = source
        self.metrics = metrics
        self.score = score

    @classmethod
    def of(cls, front: FrontModel, source: BatchTokenizer) -> SpanExtractor:
        model = front.models["extractor"]
        return cls(source, front.metrics, lambda feeds: front.bls(model, feeds, ["token_scores"])["token_scores"])

    def extract(self, texts: Sequence[str]) -> list[str]:
        encodings = self.source.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        windows = [self.span_rows(t, e) for t, e in zip(texts, encodings, strict=True)]
        found = [c for text_windows in windows for c in text_windows[0]]
        self.metrics.encoded(
            [sum(len(c.ids) for c in cs) for cs, _ in windows],
            [truncated for _, truncated in windows],
        )
        self.metrics.windows([len(cs) for cs, _ in windows])
        token_scores = self.score_rows(found)
        answers: list[str] = []
        row = 0
        for cs, _ in windows:
            best, best_score = "", -np.inf
            for c in cs:
                span_scores = [token_scores[row][p].mean() for p in c.positions]
                k = int(np.argmax(span_scores))
                if span_scores[k] > best_score:  # the earliest of equal scores, as argmax within a window
                    best, best_score = c.texts[k], span_scores[k]
                row += 1
            answers.append(best)
        return answers

    def span_rows(self, text: str, encoding: Any) -> tuple[list[Candidates], bool]:
        """The scorer's rows for one text (one for a text that fits, else one per window) and whether some of the
        text was not read whole (counted as truncated)."""
        window = self.source.max_tokens - 2  # [bos] and [eos] around the tokens
        read = sentence_windows(text, encoding.offsets, window)
        if len(read.bounds) == 1:  # the text fits: exactly what training built
            found = candidates(text, encoding.ids, encoding.offsets, self.source.max_tokens)
            return [found], found.truncated
        return [window_candidates(text, encoding.ids, encoding.offsets, a, b) for a, b in read.bounds], read.truncated

    def score_rows(self, found: Sequence[Candidates]) -> list[np.ndarray]:
        """The scorer's token scores for each row: one BLS call for a request's worth of rows, rows sorted by
        length into calls of SCORER_ROWS beyond that."""
        order = list(range(len(found)))
        if len(found) > SCORER_ROWS:
            order.sort(key=lambda r: len(found[r].ids))
        out: list[Any] = [None] * len(found)
        for at in range(0, len(order), SCORER_ROWS):
            rows = order[at : at + SCORER_ROWS]
            batch = pad_rows([found[r].ids for r in rows])
            scores = self.score({"input_ids": batch.ids, "attention_mask": batch.mask})
            for i, r in enumerate(rows):
                out[r] = scores[i]
        return out


class SummarizeFront(BeamSearchOpFront):
    Options = SummarizeOptions

    def __init__(self, pb: Any, args: dict) -> None:
        super().__init__(pb, args)
        self.spans = SpanExtractor.of(self, self.source)

    def run_group(self, texts: list[str], options: SummarizeOptions) -> list[tuple]:
        if options.mode == EXTRACTIVE:
            return [(summary,) for summary in self.spans.extract(texts)]
        return super().run_group(texts, options)


class SummarizeStreamFront(EngineFront):
    """Abstractive summaries stream from the engine; an extractive one is answered whole, as a group."""

    Options = SummarizeOptions

    def __init__(self, pb: Any, args: dict) -> None:
        super().__init__(pb, args)
        self.spans = SpanExtractor.of(self, self.source)

    def runs_as_group(self, options: SummarizeOptions) -> bool:
        return options.mode == EXTRACTIVE

    def run_group(self, texts: list[str], options: SummarizeOptions) -> list[tuple]:
        return [(summary,) for summary in self.spans.extract(texts)]
