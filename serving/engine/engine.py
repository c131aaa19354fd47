"""The generation engine: iteration-level (continuous) batching over the step graphs of export/step_export.py.

One running batch holds the rows of every source being decoded (num_beams rows each). Each iteration:

1. admit: sources that arrived since the last step are encoded together (one encoder call) and join the batch
   with an empty self-attention cache; their cross-attention keys/values are padded to the batch's longest
   source (and the batch's to theirs);
2. step: one decoder call for every row, each at its own position (`positions`) with its own cache length
   (`self_mask`; caches are right-aligned, so the new key is always the last column);
3. dispatch: each source reads its rows' log-probabilities (serving/engine/search.py) and names the rows the
   next step continues; finished and cancelled sources leave at once, and the cache columns no row needs any
   more are cut.

Nothing is padded to a longer neighbour beyond one cache column per step and the source padding of the
cross-attention, and settings (max_new_tokens, num_beams) are per source, so no grouping by settings.
`Engine.run_until_idle` drives the loop in the caller's thread (tests, offline use); `Engine.start` runs it in a
background thread, which the Triton front model does.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from export.providers import inference_session
from serving.engine import search
from serving.engine.search import Decoding, best_candidates, block_repeated_ngrams

TokenCallback = Callable[[list[int], bool], None]  # (newly stable tokens, final)


@dataclass(frozen=True)
class Shapes:
    """What the engine needs to know of the model to allocate caches."""

    n_layers: int  # decoder layers: self-attention caches
    n_cross: int  # cross-attention (key, value) pairs: decoder layers (+ the copy pointer's)
    n_heads: int
    head_dim: int


@dataclass(eq=False)
class Job:
    """One source text submitted to the engine. `on_tokens` receives the tokens every possible answer starts
    with as they become known, and the rest with final=True; `cancelled()` is polled once per step."""

    source: list[int]  # token ids, truncated and ending with eos
    max_new_tokens: int
    num_beams: int
    on_tokens: TokenCallback
    cancelled: Callable[[], bool] = lambda: False
    submitted: float = field(default_factory=time.perf_counter)
    sequence: search.Sequence | None = None
    sent: int = 0  # tokens already passed to on_tokens


@dataclass
class Stats:
    """Counters the front model turns into metrics."""

    steps: int = 0
    running_rows: int = 0
    generated_tokens: int = 0
    queue_seconds: list[float] = field(default_factory=list)  # per admitted job, drained by the reader
    first_token_seconds: list[float] = field(default_factory=list)  # per job, from submission; drained too

    def drain(self) -> tuple[list[float], list[float]]:
        """The waits and first-token times recorded since the last call."""
        waits, self.queue_seconds = self.queue_seconds, []
        firsts, self.first_token_seconds = self.first_token_seconds, []
        return waits, firsts


class Engine:
    def __init__(
        self,
        encoder: Path,
        decoder: Path,
        shapes: Shapes,
        decoding: Decoding,
        threads: int = 1,
        max_rows: int = 256,
    ) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # CUDA where this onnxruntime has it (export/providers.py). The caches live in NumPy between steps, so
        # on a GPU every step copies them both ways: correct, not yet fast (not run here: no GPU).
        self.encoder = inference_session(encoder, options)
        self.decoder = inference_session(decoder, options)
        self.cross_names = [o.name for o in self.encoder.get_outputs()]
        self.past_names = [i.name for i in self.decoder.get_inputs() if i.name.startswith("past_")]
        self.present_names = [o.name for o in self.decoder.get_outputs() if o.name.startswith("present_")]
        self.vocab = self.decoder.get_outputs()[0].shape[1]  # log_probs [B, V]: V is static
        self.shapes = shapes
        self.decoding = decoding
        self.max_rows = max_rows
        self.stats = Stats()
        self._pending: deque[Job] = deque()
        self._wake = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._jobs: list[Job] = []  # in row order
        self._reset_batch()

    # -- submitting --------------------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        with self._wake:
            self._pending.append(job)
            self._wake.notify()

    def queued_rows(self) -> int:
        """Rows running and waiting: what a new source queues behind."""
        with self._wake:
            return sum(job.num_beams for job in (*self._jobs, *self._pending))

    def busy(self) -> bool:
        """Anything running or waiting."""
        with self._wake:
            return bool(self._jobs or self._pending)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="generation-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()

    def run_until_idle(self) -> None:
        """Step until nothing is pending or running (in the caller's thread)."""
        while self.busy():
            self.iterate()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not (self._pending or self._jobs or self._stop):
                    self._wake.wait()
                if self._stop:
                    return
            self.iterate()

    # -- one iteration -------------------------------------------------------------------------------------------
    def iterate(self) -> None:
        admitted = self._admit()
        if admitted or self._keep is not None:
            self._rebuild(admitted)
        if not self._jobs:
            return
        self._dispatch(*self._decode())

    def _reset_batch(self) -> None:
        h, d = self.shapes.n_heads, self.shapes.head_dim
        self.self_kv = [np.zeros((0, h, 1, d), np.float32) for _ in range(2 * self.shapes.n_layers)]
        self.self_mask = np.zeros((0, 1), np.int32)  # one padding column: the step graph wants a cache
        self.cross_kv = [np.zeros((0, h, 1, d), np.float32) for _ in range(2 * self.shapes.n_cross)]
        self.cross_mask = np.zeros((0, 1), np.int32)
        # rows of the current arrays the next step continues (self-attention: beam reorder included;
        # cross-attention: the same sources, identical across beams); None: all of them, in order
        self._keep: list[int] | None = None
        self._keep_sources: list[int] | None = None

    def _admit(self) -> list[tuple[Job, list[np.ndarray]]]:
        """Pending jobs that fit, encoded together: (job, its cross-attention arrays [1, H, S_job, Dh])."""
        with self._wake:
            admitted = []
            rows = sum(job.num_beams for job in self._jobs)
            # An encoder call costs about the same for one source or eight: while the batch is nearly full,
            # wait for a quarter of it to free up (a few steps) and encode the newcomers together.
            if rows and self.max_rows - rows < self.max_rows // 4:
                return []
            while self._pending and rows + self._pending[0].num_beams <= self.max_rows:
                job = self._pending.popleft()
                rows += job.num_beams
                admitted.append(job)
            if not admitted and self._pending and not self._jobs:  # one source wider than max_rows
                admitted.append(self._pending.popleft())
        admitted = [job for job in admitted if not self._refuse_cancelled(job)]
        if not admitted:
            return []
        now = time.perf_counter()
        self.stats.queue_seconds += [now - job.submitted for job in admitted]
        width = max(len(job.source) for job in admitted)
        ids = np.zeros((len(admitted), width), np.int32)
        for i, job in enumerate(admitted):
            ids[i, : len(job.source)] = job.source
            job.sequence = search.Sequence(self.decoding, job.max_new_tokens, job.num_beams)
        cross = self.encoder.run(self.cross_names, {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int32)})
        return [(job, [c[i : i + 1, :, : len(job.source)] for c in cross]) for i, job in enumerate(admitted)]

    def _rebuild(self, admitted: list[tuple[Job, list[np.ndarray]]]) -> None:
        """The arrays of the next step in one copy each: the rows that continue (reordered, the cache columns no
        row needs any more cut), then the admitted rows (an empty cache; their sources padded to the longest)."""
        keep, sources = self._keep, self._keep_sources
        kept_self = self.self_mask if keep is None else self.self_mask[keep]
        kept_mask = self.cross_mask if sources is None else self.cross_mask[sources]
        rows = len(kept_self) + sum(job.num_beams for job, _ in admitted)
        h, d = self.shapes.n_heads, self.shapes.head_dim
        # self-attention: right-aligned caches, so the columns no kept row uses are at the left
        used = kept_self.any(axis=0)
        first = min(int(used.argmax()) if used.any() else used.size, used.size - 1)
        cached = self.self_mask.shape[1] - first
        self.self_kv = [_take_rows(kv[:, :, first:], keep, (rows, h, cached, d)) for kv in self.self_kv]
        self.self_mask = _take_rows(kept_self[:, first:], None, (rows, cached))
        # cross-attention: the kept sources cut to their longest, then the admitted ones
        kept_width = int(kept_mask.any(axis=0).nonzero()[0].max()) + 1 if kept_mask.any() else 1
        width = max([kept_width] + [c[0].shape[2] for _, c in admitted])
        beams = [job.num_beams for job, _ in admitted]
        self.cross_kv = [
            _take_rows(kv[:, :, :kept_width], sources, (rows, h, width, d), [c[i] for _, c in admitted], beams)
            for i, kv in enumerate(self.cross_kv)
        ]
        new_masks = [np.ones((1, len(job.source)), np.int32) for job, _ in admitted]
        self.cross_mask = _take_rows(kept_mask[:, :kept_width], None, (rows, width), new_masks, beams)
        self._jobs += [job for job, _ in admitted]
        self._keep = self._keep_sources = None

    def _refuse_cancelled(self, job: Job) -> bool:
        if job.cancelled():
            job.on_tokens([], True)
            return True
        return False

    def _decode(self) -> tuple[np.ndarray, np.ndarray]:
        """One decoder step for every row: each row's best TOP_K (log-probabilities, token ids), or with n-gram
        blocking all its log-probabilities (and the ids 0..V-1), which the blocking must see."""
        beams = [beam for job in self._jobs for beam in job.sequence.row_beams()]
        rows = len(beams)
        self_mask = np.concatenate([self.self_mask, np.ones((rows, 1), np.int32)], axis=1)
        feeds = {
            "input_ids": np.array([[beam[-1]] for beam in beams], np.int32),
            "positions": np.array([len(beam) - 1 for beam in beams], np.int64),
            "self_mask": self_mask,
            "cross_mask": self.cross_mask,
            **dict(zip(self.past_names, self.self_kv)),
            **dict(zip(self.cross_names, self.cross_kv)),
        }
        if self.decoding.no_repeat_ngram_size:
            log_probs, *present = self.decoder.run(["log_probs", *self.present_names], feeds)
            self._block_ngrams(log_probs)
            scores, ids = log_probs, None
        else:
            scores, ids, *present = self.decoder.run(["top_log_probs", "top_ids", *self.present_names], feeds)
        self.self_kv, self.self_mask = present, self_mask
        self.stats.steps += 1
        self.stats.running_rows = rows
        return scores, ids

    def _block_ngrams(self, log_probs: np.ndarray) -> None:
        start = 0
        for job in self._jobs:
            rows = slice(start, start + job.num_beams)
            block_repeated_ngrams(log_probs[rows], job.sequence.row_beams(), self.decoding.no_repeat_ngram_size)
            start += job.num_beams

    def _dispatch(self, scores: np.ndarray, ids: np.ndarray | None) -> None:
        """Every source takes its step; finished and cancelled ones leave; the next step's rows are noted."""
        starts = np.cumsum([0] + [job.num_beams for job in self._jobs])
        parents = self._search(scores, ids, starts)
        keep: list[int] = []
        sources: list[int] = []
        jobs: list[Job] = []
        for job, start, rows in zip(self._jobs, starts, parents):
            if job.cancelled():
                job.on_tokens([], True)
                continue
            self._report(job)
            if job.sequence.finished:
                continue
            keep += [int(start) + parent for parent in rows]
            sources += range(start, start + job.num_beams)
            jobs.append(job)
        total = int(starts[-1])
        self._keep = None if keep == list(range(total)) else keep
        self._keep_sources = None if sources == list(range(total)) else sources
        self._jobs = jobs
        self.stats.running_rows = sum(job.num_beams for job in jobs)
        if not jobs:
            self._reset_batch()

    def _search(self, scores: np.ndarray, ids: np.ndarray | None, starts: np.ndarray) -> list[list[int]]:
        """Each source's step; the argmax and top-k work is done for all sources of one beam width at once.

        scores [R, C]: per row its best C log-probabilities with their token ids `ids` (C = TOP_K), or all of them
        (ids None: column = token id). A beam search's 2·k best over [k × V] are among its rows' best 2·k each.
        """
        parents: list[list[int]] = [[] for _ in self._jobs]
        by_width: dict[int, list[int]] = {}
        for i, job in enumerate(self._jobs):
            by_width.setdefault(job.num_beams, []).append(i)
        columns = scores.shape[1]
        for k, members in by_width.items():
            rows = (starts[members][:, None] + np.arange(k)).reshape(-1)
            if k == 1:
                best = scores[rows].argmax(axis=1)
                tokens = best if ids is None else ids[rows, best]
                for i, token in zip(members, tokens.tolist()):
                    parents[i] = self._jobs[i].sequence.take_token(token)
                continue
            beam_scores = np.stack([self._jobs[i].sequence.row_scores() for i in members])  # [n, k]
            flat = (scores[rows].reshape(len(members), k, columns) + beam_scores[:, :, None]).reshape(len(members), -1)
            picked, values = best_candidates(flat, 2 * k)  # indices into [k × C]
            if ids is not None:  # [k × TOP_K] positions → [k × V] positions
                tokens = np.take_along_axis(ids[rows].reshape(len(members), -1), picked, axis=1)
                picked = (picked // columns) * self.vocab + tokens
            for n, i in enumerate(members):
                parents[i] = self._jobs[i].sequence.take_candidates(picked[n], values[n], self.vocab)
        return parents

    def _report(self, job: Job) -> None:
        seq = job.sequence
        if seq.steps == 1:  # its first token (or its end) is known now
            self.stats.first_token_seconds.append(time.perf_counter() - job.submitted)
        stable = seq.stable_tokens()
        if seq.finished:
            self.stats.generated_tokens += len(seq.result)
            job.on_tokens(stable[job.sent :], True)
        elif len(stable) > job.sent:
            job.on_tokens(stable[job.sent :], False)
            job.sent = len(stable)


def _take_rows(
    array: np.ndarray,
    rows: list[int] | None,
    shape: tuple[int, ...],
    appended: Sequence[np.ndarray] = (),
    repeats: Sequence[int] = (),
) -> np.ndarray:
    """A new array of `shape`: array[rows] (all rows, in order, when None), then each appended array repeated
    `repeats[i]` times; each part sits at the start of the other axes and the rest is zero. One copy of the data."""
    out = np.empty(shape, array.dtype)
    head = out[: array.shape[0] if rows is None else len(rows)]
    if array.shape[1:] == shape[1:]:
        if rows is None:
            head[...] = array
        else:
            np.take(array, rows, axis=0, out=head, mode="clip")  # rows are valid; "raise" copies twice
    else:
        head[...] = 0
        head[(slice(None), *(slice(0, n) for n in array.shape[1:]))] = array if rows is None else array[rows]
    at = len(head)
    for part, times in zip(appended, repeats):
        block = out[at : at + times]
        block[...] = 0
        block[(slice(None), *(slice(0, n) for n in part.shape[1:]))] = part
        at += times
    if at < shape[0]:
        out[at:] = 0
    return out
