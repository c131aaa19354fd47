"""Sampling one source's next token, the way Hugging Face's `generate(do_sample=True)` shapes the distribution:
repetition penalty, then temperature, then top-k, then top-p (its processors' order), then one draw from the
job's own random generator, so that the same seed gives the same answer whatever else the batch holds.

The decoder gives log-probabilities rather than logits; they differ by one constant per row, which temperature,
top-k, top-p and the softmax do not see. The repetition penalty does: on log-probabilities (all ≤ 0) it always
multiplies, where on logits it divides the positive ones. Both make a seen token less likely; the numbers differ
from `generate`'s, and so do sampled answers (a sampled answer is not compared with `generate`'s, a seeded one
with itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class Sampling:
    """How a sampled job draws its tokens. temperature > 0; top_k 0 keeps every token; top_p 1.0 keeps every
    token; repetition_penalty 1.0 changes nothing; seed None draws a fresh one."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be above 0 (0 is greedy: no Sampling), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 (off) or positive, got {self.top_k}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be above 0, got {self.repetition_penalty}")

    def generator(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


def sample(log_probs: NDArray[Any], seen: list[int], sampling: Sampling, generator: np.random.Generator) -> int:
    """One token drawn from a row's log-probabilities [V] shaped by `sampling`; `seen`: the row's tokens so far
    (prompt included, as generate's repetition penalty counts them)."""
    scores = log_probs.astype(np.float64)
    if sampling.repetition_penalty != 1.0:
        ids = np.unique(np.asarray(seen, dtype=np.int64))
        values = scores[ids]
        scores[ids] = np.where(values < 0, values * sampling.repetition_penalty, values / sampling.repetition_penalty)
    scores /= sampling.temperature
    vocab = scores.shape[0]
    if 0 < sampling.top_k < vocab:
        candidates = np.argpartition(-scores, sampling.top_k - 1)[: sampling.top_k]
    else:
        candidates = np.flatnonzero(np.isfinite(scores))
    values = scores[candidates]
    order = np.argsort(-values, kind="stable")
    candidates, values = candidates[order], values[order]
    probs = np.exp(values - values[0])
    probs /= probs.sum()
    if sampling.top_p < 1.0:
        # the smallest set of the likeliest tokens whose probabilities reach top_p (at least one)
        before = np.cumsum(probs) - probs
        kept = max(1, int(np.count_nonzero(before < sampling.top_p)))
        candidates, probs = candidates[:kept], probs[:kept] / probs[:kept].sum()
    drawn = int(np.searchsorted(np.cumsum(probs), generator.random(), side="right"))
    return int(candidates[min(drawn, len(candidates) - 1)])
