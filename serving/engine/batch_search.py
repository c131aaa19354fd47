"""One step of every source's search over the decoder's scores for the whole running batch: n-gram blocking, the
forced last token, then greedy and beam search, the argmax and top-k work done for all sources of one beam width
at once. Each source's own rules are its SourceSearch's (serving/engine/search.py).

Scores arrive as each row's best TOP_K log-probabilities with their token ids, or, the rare step where that is not
exact, all of them (ids None: column = token id). A beam search of k beams reads the 2·k best over [k × vocab],
and those are among its rows' best 2·k each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from serving.engine.hypotheses import repeated_ngram_tokens
from serving.engine.job import Job
from serving.engine.sampling import sample
from serving.engine.search import LOWEST, Decoding, best_candidates


def block_ngrams(
    jobs: Sequence[Job],
    n: int,
    top_scores: NDArray[Any],
    top_ids: NDArray[Any],
    all_log_probs: Callable[[], NDArray[Any]],
) -> tuple[NDArray[Any], NDArray[Any] | None]:
    """Tokens that would repeat an n-gram of their row's sequence get the lowest score, in place. A search of k
    beams reads each row's 2·k best tokens, and those are among its TOP_K best as long as no more than
    TOP_K − 2·k of them are blocked; most rows have none blocked. A step where some row has more blocked
    returns all the log-probabilities instead (blocked there), so the result is always exact."""
    top_k = top_ids.shape[1]
    exact = True
    blocked: list[tuple[int, list[int]]] = []  # (row, its blocked tokens)
    row = 0
    for job in jobs:
        for sequence in job.state.row_beams():
            banned = repeated_ngram_tokens(sequence, n)
            if banned:
                blocked.append((row, banned))
                hit = np.isin(top_ids[row], banned)
                top_scores[row, hit] = LOWEST
                exact = exact and int(hit.sum()) <= top_k - 2 * job.num_beams
            row += 1
    if exact:
        return top_scores, top_ids
    log_probs = all_log_probs()
    for row, banned in blocked:
        log_probs[row, banned] = LOWEST
    return log_probs, None


def force_eos(
    jobs: Sequence[Job], eos: int, scores: NDArray[Any], ids: NDArray[Any] | None, starts: Sequence[int]
) -> None:
    """The rows of sources about to take their last step may only end (Hugging Face's forced_eos_token_id):
    eos at log-probability 0, every other token at the lowest score, in place."""
    for job, start in zip(jobs, starts):
        if job.state.steps != job.max_new_tokens - 1:
            continue
        rows = slice(start, start + job.num_beams)
        scores[rows] = LOWEST
        if ids is None:
            scores[rows, eos] = 0.0
        else:
            scores[rows, 0], ids[rows, 0] = 0.0, eos


def take_step(
    jobs: Sequence[Job],
    decoding: Decoding,
    vocab: int,
    scores: NDArray[Any],
    ids: NDArray[Any] | None,
    starts: NDArray[Any],
    all_log_probs: Callable[[], NDArray[Any]],
) -> list[list[int]]:
    """Every source's step; for each, the rows of its own its next step continues ([] once finished). A sampled
    source draws from its row's whole distribution (`all_log_probs`), n-gram blocking and the forced last token
    applied to it as to the others."""
    if decoding.forced_eos:
        force_eos(jobs, decoding.eos_id, scores, ids, starts.tolist())
    parents: list[list[int]] = [[] for _ in jobs]
    by_width: dict[int, list[int]] = {}
    for i, job in enumerate(jobs):
        if job.sampling is not None:
            parents[i] = job.state.take_token(_drawn(job, decoding, int(starts[i]), scores, ids, all_log_probs))
            continue
        by_width.setdefault(job.num_beams, []).append(i)
    columns = scores.shape[1]
    for k, members in by_width.items():
        rows = (starts[members][:, None] + np.arange(k)).reshape(-1)
        if k == 1:
            best = scores[rows].argmax(axis=1)
            tokens = best if ids is None else ids[rows, best]
            for i, token in zip(members, tokens.tolist()):
                parents[i] = jobs[i].state.take_token(token)
            continue
        beam_scores = np.stack([jobs[i].state.row_scores() for i in members])  # [n, k]
        flat = (scores[rows].reshape(len(members), k, columns) + beam_scores[:, :, None]).reshape(len(members), -1)
        picked, values = best_candidates(flat, 2 * k)  # indices into [k × C]
        if ids is not None:  # [k × TOP_K] positions → [k × V] positions
            tokens = np.take_along_axis(ids[rows].reshape(len(members), -1), picked, axis=1)
            picked = (picked // columns) * vocab + tokens
        for n, i in enumerate(members):
            parents[i] = jobs[i].state.take_candidates(picked[n], values[n], vocab)
    return parents


def _drawn(
    job: Job,
    decoding: Decoding,
    row: int,
    scores: NDArray[Any],
    ids: NDArray[Any] | None,
    all_log_probs: Callable[[], NDArray[Any]],
) -> int:
    """A sampled source's next token, drawn from its one row."""
    state = job.state
    assert job.sampling is not None and state.generator is not None
    if ids is None:  # the step's scores are every token's, blocked and forced already
        log_probs = scores[row]
    elif decoding.forced_eos and state.steps == job.max_new_tokens - 1:
        return decoding.eos_id
    else:
        log_probs = all_log_probs()[row].copy()
        banned = repeated_ngram_tokens(state.beams[0], decoding.no_repeat_ngram_size)
        log_probs[banned] = LOWEST
    return sample(log_probs, state.beams[0], job.sampling, state.generator)
