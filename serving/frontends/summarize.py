"""`summarize` and `summarize_stream`: the generator's headline (MODE = "abstractive"), or the text's best span
(MODE = "extractive"), picked by the span scorer (the model of role `extractor`, export/extractive.py).

Extraction is one BLS call for all texts of a group: the scorer gives every token of [bos] + text + [eos] a score,
a candidate span (export/spans.py, the same cut as in training) scores the mean over its tokens, and the best span
is the answer. The streaming twin sends an extractive answer whole, in one final response.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from export.spans import candidates
from serving.frontends.base import padded_width
from serving.frontends.continuous import ContinuousFront
from serving.frontends.generation import GenerationFront

EXTRACTIVE = "extractive"


class SpanExtraction:
    """What both summarize front models add: `extract(texts)`. Mixed into a FrontModel with `self.source`."""

    def extract(self, texts: Sequence[str]) -> list[str]:
        encodings = self.source.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        found = [candidates(t, e.ids, e.offsets, self.source.max_tokens) for t, e in zip(texts, encodings, strict=True)]
        self.metrics.encoded([len(c.ids) for c in found], [c.truncated for c in found])
        ids = np.zeros((len(found), padded_width(max(len(c.ids) for c in found))), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, c in enumerate(found):
            ids[row, : len(c.ids)] = c.ids
            mask[row, : len(c.ids)] = 1
        scores = self.bls(self.models["extractor"], {"input_ids": ids, "attention_mask": mask}, ["token_scores"])
        token_scores = scores["token_scores"]
        return [
            c.texts[int(np.argmax([token_scores[row, p].mean() for p in c.positions]))] for row, c in enumerate(found)
        ]


class SummarizeFront(SpanExtraction, GenerationFront):
    def run_group(self, texts: list[str], options: tuple) -> list[tuple]:
        if dict(options)["mode"] == EXTRACTIVE:
            return [(summary,) for summary in self.extract(texts)]
        return super().run_group(texts, options)


class SummarizeStreamFront(SpanExtraction, ContinuousFront):
    def answers_whole(self, settings: dict[str, Any]) -> bool:
        return settings["mode"] == EXTRACTIVE

    def whole_answer(self, texts: list[str], settings: dict[str, Any]) -> list[str]:
        return self.extract(texts)
