"""Greedy and beam search for one source text, one step at a time, in NumPy.

A `SourceSearch` owns `num_beams` rows of the engine's running batch and nothing else: each step it reads the
log-probabilities of its own rows and says which of them the next step continues (the beam reorder), or that
it is finished. Sources never look at each other, which is what lets them join and leave the batch at any step.

The rules are the reference's (export/model/reference_search.py), which follows ONNX Runtime's BeamSearch op step
by step: the top 2·k candidates over [k × vocab] of `log_probs + beam score`; an eos among the first k closes a
hypothesis scored `sum_logprobs / len ** length_penalty` (len counts bos); with early stopping a source is done once
it has k hypotheses; after max_new_tokens steps the live beams compete with the hypotheses. Greedy is argmax until
eos. A checkpoint imported from Hugging Face (`Decoding.early_stopping` False, `forced_eos`) gets `generate`'s rules
instead, which differ only in when a search stops and in its last step.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
from numpy.typing import NDArray

from serving.engine.hypotheses import Hypotheses
from serving.engine.sampling import Sampling

INITIAL_BEAM_SCORE = np.float32(-1e9)  # beams 1..k-1 at the first step, so the beams differ
LOWEST = np.finfo(np.float32).min


def best_candidates(scores: NDArray[Any], count: int) -> tuple[NDArray[Any], NDArray[Any]]:
    """For each row of scores [n, K]: the `count` best column indices and their scores, best first; equal scores
    keep the lower index first (the order of torch.topk, which the reference uses)."""
    picked = np.argpartition(-scores, count - 1, axis=1)[:, :count]
    picked.sort(axis=1)
    values = np.take_along_axis(scores, picked, axis=1)
    order = np.argsort(-values, axis=1, kind="stable")
    return np.take_along_axis(picked, order, axis=1), np.take_along_axis(values, order, axis=1)


class Finish(Enum):
    """Why a source's decoding ended."""

    EOS = "eos"  # it generated eos (or, beam search, had its hypotheses and could not improve on them)
    LENGTH = "length"  # it ran out of new tokens (max_new_tokens)
    CANCELLED = "cancelled"  # its client went away
    ERROR = "error"  # its step failed (the output carries the message)


@dataclass(frozen=True)
class Decoding:
    """What every source of one engine shares: the special ids and the checkpoint's decoding settings."""

    bos_id: int  # the decoder's start token
    eos_id: int
    length_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    # True: a beam search is done once it has k finished hypotheses (ONNX Runtime's BeamSearch, our checkpoints).
    # False: Hugging Face's default, done once they are k and the best live beam, scored at its length, can no
    # longer beat the worst of them.
    early_stopping: bool = True
    forced_eos: bool = False  # the last step allowed may only produce eos (Hugging Face's forced_eos_token_id)
    # More tokens that end a sequence as eos does (a chat model's end of turn beside its end of text).
    other_eos_ids: tuple[int, ...] = ()
    # generate's rules where ONNX Runtime's differ beyond early stopping: at the length limit (a checkpoint imported
    # from Hugging Face)
    huggingface: bool = False

    def is_eos(self, token: int) -> bool:
        return token == self.eos_id or token in self.other_eos_ids


class SourceSearch:
    """One source text being decoded: its live beams and their scores. A beam's tokens start with its prefix:
    the decoder's start token (bos) of an encoder-decoder, a decoder-only model's whole prompt."""

    def __init__(
        self,
        decoding: Decoding,
        max_new_tokens: int,
        num_beams: int,
        prefix: list[int] | None = None,
        sampling: Sampling | None = None,
    ) -> None:
        self.decoding = decoding
        self.sampling = sampling  # its tokens are drawn (take_token), from a generator of its own
        self.generator = sampling.generator() if sampling is not None else None
        self.max_new_tokens = max_new_tokens
        self.num_beams = num_beams
        prefix = [decoding.bos_id] if prefix is None else list(prefix)
        self.start = len(prefix)  # where the generated tokens begin in a beam
        self.beams = [prefix]  # one row until the first step: the other beams start at -1e9
        self.scores = np.zeros(1, dtype=np.float32)
        # generate scores a hypothesis by its generated tokens plus one (its eos), which with a prefix of one
        # (bos) is the beam's whole length
        self.hypotheses = Hypotheses(num_beams, decoding.length_penalty, uncounted=self.start - 1)
        self.steps = 0
        self.result: list[int] | None = None  # the answer (no bos, no eos) once finished
        self.finish: Finish | None = None

    def row_beams(self) -> list[list[int]]:
        """The token list of each of its rows; before the first step every row holds just bos."""
        return self.beams if len(self.beams) == self.num_beams else self.beams * self.num_beams

    @property
    def finished(self) -> bool:
        return self.result is not None

    @property
    def cached_columns(self) -> int:
        """The keys each of its rows has in the self-attention cache: all its tokens but the newest."""
        return self.start - 1 + self.steps

    def row_scores(self) -> NDArray[Any]:
        """The beam score of each of its rows [num_beams]: 0 for beam 0 and -1e9 for the others at the first
        step (their rows are copies of beam 0's), so that the beams differ."""
        if len(self.scores) == self.num_beams:
            return self.scores
        scores = np.full(self.num_beams, INITIAL_BEAM_SCORE, np.float32)
        scores[0] = self.scores[0]
        return scores

    def take_token(self, token: int) -> list[int]:
        """Greedy or sampled: advance by the argmax (or drawn) token. Returns [0] (its one row continues), or []
        once finished."""
        self.steps += 1
        if self.decoding.is_eos(token):
            return self._end(self.beams[0][self.start :], Finish.EOS)
        self.beams[0].append(token)
        if self.steps == self.max_new_tokens:
            return self._end(self.beams[0][self.start :], Finish.LENGTH)
        return [0]

    def take_candidates(self, indices: NDArray[Any], scores: NDArray[Any], vocab: int) -> list[int]:
        """Beam search: advance given the best 2·k candidates over [k × vocab] of `log_probs + row_scores()`,
        best first (flat indices and their scores). Returns, for each row of the next step, the row it
        continues (a beam reorder), or [] once finished."""
        self.steps += 1
        k, beams = self.num_beams, self.row_beams()
        chosen: list[tuple[int, int, np.float32]] = []
        for j, (index, score) in enumerate(zip(indices.tolist(), scores)):
            row, token = index // vocab, index % vocab
            if not self.decoding.is_eos(token):
                chosen.append((row, token, score))
            elif j < k:
                self.hypotheses.add(beams[row], float(score))
            if len(chosen) == k:
                break
        if self.hypotheses.full() and self.decoding.early_stopping:
            return self._end(self.hypotheses.items[0][1][self.start :], Finish.EOS)
        self.beams = [beams[row] + [token] for row, token, _ in chosen]
        self.scores = np.array([score for _, _, score in chosen], dtype=np.float32)
        if self.hypotheses.full() and not self._can_improve():
            return self._end(self.hypotheses.items[0][1][self.start :], Finish.EOS)
        if self.steps == self.max_new_tokens:  # out of steps: the live beams compete with the hypotheses
            if self.decoding.huggingface:  # generate's length limit finishes the k best candidates that go on,
                # each scored by its tokens so far (an eos would have counted one more)
                for index, score in zip(indices[:k].tolist(), scores[:k]):
                    row, token = index // vocab, index % vocab
                    if not self.decoding.is_eos(token):
                        self.hypotheses.add(beams[row] + [token], float(score), self.steps)
            else:
                for beam, score in zip(self.beams, self.scores):
                    self.hypotheses.add(beam, float(score))
            return self._end(self.hypotheses.items[0][1][self.start :], Finish.LENGTH)
        return [row for row, _, _ in chosen]

    def _end(self, result: list[int], finish: Finish) -> list[int]:
        """Finished: no row continues."""
        self.result, self.finish = result, finish
        return []

    def _can_improve(self) -> bool:
        """Whether the best live beam, scored at its present length, beats the worst finished hypothesis: Hugging
        Face's stopping rule without early stopping (its `_check_early_stop_heuristic`)."""
        best = np.float32(self.scores[0] / np.float32(self.steps) ** self.decoding.length_penalty)
        return bool(best > self.hypotheses.items[-1][0])

    def stable_tokens(self) -> list[int]:
        """Generated tokens that every possible answer starts with: all of them once finished; for greedy the
        tokens so far; for beam search the common prefix of the live beams and the hypotheses."""
        if self.result is not None:
            return self.result
        start = self.start
        candidates = [beam[start:] for beam in self.beams] + [tokens[start:] for _, tokens in self.hypotheses.items]
        prefix = candidates[0]
        for other in candidates[1:]:
            n = next((i for i, (a, b) in enumerate(zip(prefix, other)) if a != b), min(len(prefix), len(other)))
            prefix = prefix[:n]
        return prefix
