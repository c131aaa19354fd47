"""The rules of ONNX Runtime's BeamSearch that need no tensors: the finished sequences of one source, and the
tokens its NoRepeatNGramLogitsProcessor blocks.

Shared by the PyTorch reference (export/model/reference_search.py) and the serving engine
(serving/engine/search.py), so it needs only NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Hypotheses:
    """The best finished sequences of one source, best first (at most num_beams)."""

    num_beams: int
    length_penalty: float
    items: list[tuple[float, list[int]]] = field(default_factory=list)  # (score, tokens incl. bos)
    done: bool = False
    uncounted: int = 0  # leading tokens the length penalty does not count (a decoder-only prompt but one)

    def score(self, sum_logprobs: float, length: int) -> float:
        return float(np.float32(sum_logprobs / length**self.length_penalty))

    def add(self, tokens: list[int], sum_logprobs: float, length: int | None = None) -> None:
        """A finished sequence, scored at `length` (by default its tokens but the uncounted ones)."""
        score = self.score(sum_logprobs, len(tokens) - self.uncounted if length is None else length)
        if len(self.items) == self.num_beams:
            if score <= self.items[-1][0]:
                return
            self.items.pop()
        at = next((i for i, (s, _) in enumerate(self.items) if score > s), len(self.items))
        self.items.insert(at, (score, tokens))  # after equal scores, like ORT's insertion

    def full(self) -> bool:
        return len(self.items) == self.num_beams


def repeated_ngram_tokens(sequence: list[int], n: int) -> list[int]:
    """The tokens that would complete an n-gram already in `sequence` (bos included), sorted."""
    if n <= 0 or len(sequence) < n:
        return []
    prefix = sequence[len(sequence) - n + 1 :]
    return sorted({sequence[j + n - 1] for j in range(len(sequence) - n + 1) if sequence[j : j + n - 1] == prefix})
