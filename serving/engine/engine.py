"""The generation engine: iteration-level (continuous) batching over the step graphs of export/graphs/step_export.py.

One running batch holds the rows of every source being decoded (num_beams rows each). Each iteration:

1. admit: sources that arrived since the last step are encoded (one encoder call per group of similar lengths,
   `length_groups`) straight into the rows after the running sources' and join the batch with an empty
   self-attention cache; cross-attention keys/values are stored once per source (not per beam);
2. step: one decoder call for every row, each at its own position (`positions`: the keys it has cached);
3. dispatch: each source reads its rows' log-probabilities (serving/engine/search.py) and names the rows the
   next step continues; finished and cancelled sources leave at once.

The self-attention caches are buffers that outlive the steps: row r's keys fill columns 0..positions[r]-1, and
the decoder writes each new key in place (GroupQueryAttention, its present bound to the buffer's memory). Between
steps only rows that move are copied (a beam that continues another beam, the last source moving into the place
a finished one left), never the whole cache, and a newcomer's rows need nothing copied at all. The
cross-attention keys/values are buffers too, one row per source: a finished source's row is taken by the last
source's, and the encoder's output goes straight into the newcomers' rows. Their width is the longest running
source rounded up to CROSS_COLUMNS_STEP tokens, kept while it fits, so it changes (a copy of every row) only when
a longer source arrives or the running ones fit in half of it.

Nothing is padded to a longer neighbour beyond the source padding of the cross-attention, and settings
(max_new_tokens, num_beams) are per source, so no grouping by settings. While every running source has the same
beam width the decoder reads the cross-attention once per source; a batch of mixed widths gets it repeated per
row for the step.
Which waiting sources join the batch, and when, is the scheduler's (serving/engine/scheduler.py).
`Engine.run_until_idle` drives the loop in the caller's thread (tests, offline use); `Engine.start` runs it in a
background thread, which the Triton front model does.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from numpy.typing import NDArray

from serving.engine import search
from serving.engine.config import EngineConfig
from serving.engine.hypotheses import repeated_ngram_tokens
from serving.engine.job import Job
from serving.engine.scheduler import Scheduler
from serving.engine.search import LOWEST, best_candidates
from serving.providers import inference_session
from tasks import generation_contract as contract

# What one more encoder call costs beyond its tokens, in padded tokens (see length_groups).
ENCODER_CALL_TOKENS = 32
# The cross-attention buffers' width grows and shrinks in steps of this many source tokens.
CROSS_COLUMNS_STEP = 16


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
        config: EngineConfig,
        threads: int = 1,
        max_rows: int = 256,
    ) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # CUDA where this onnxruntime has it (serving/providers.py). The caches live in NumPy between steps, and
        # ORT's CUDA GroupQueryAttention takes float16/bfloat16 only, so on a GPU the float32 self-attention runs
        # on the CPU provider and the caches cross over every step: correct, not yet fast (not run here: no GPU).
        self.encoder = inference_session(encoder, options)
        self.decoder = inference_session(decoder, options)
        # Everything the engine knows of the model comes from the graphs, as the contract lays them out.
        shapes = contract.layout(
            {i.name: i.shape for i in self.decoder.get_inputs()}, {o.name: o.shape for o in self.decoder.get_outputs()}
        )
        self.layout = shapes
        self.cross_names = contract.cross_names(shapes.n_cross)
        self.past_names = contract.self_cache_names("past", shapes.n_layers)
        self.present_names = contract.self_cache_names("present", shapes.n_layers)
        self.vocab = shapes.vocab
        self.decoding = config.decoding
        self.max_rows = max_rows
        self.stats = Stats()
        self.scheduler = Scheduler(max_rows)
        self._wake = self.scheduler.wake
        self._stop = False
        self._thread: threading.Thread | None = None
        self._jobs: list[Job] = []  # in row order
        h, d = shapes.n_heads, shapes.head_dim
        # self-attention caches [rows, H, columns, Dh], grown on demand (_reserve)
        self._cache = [np.zeros((8, h, 16, d), np.float32) for _ in range(2 * shapes.n_layers)]
        # cross-attention keys/values [sources, H, columns, Dh] and mask [sources, columns], one row per running
        # source in job order; also buffers that outlive the steps (_place_sources)
        self._cross = [np.zeros((8, h, CROSS_COLUMNS_STEP, d), np.float32) for _ in range(2 * shapes.n_cross)]
        self._cross_mask = np.zeros((8, CROSS_COLUMNS_STEP), np.int32)
        self._reset_batch()

    # -- submitting --------------------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        if not 1 <= job.num_beams <= self.layout.max_beams:
            raise ValueError(
                f"num_beams must be between 1 and {self.layout.max_beams} (the decoder returns {self.layout.top_k} "
                f"tokens per row), got {job.num_beams}"
            )
        self.scheduler.submit(job)

    def queued_rows(self) -> int:
        """Rows running and waiting: the engine's backlog, which the front model bounds."""
        with self._wake:
            return self.scheduler.waiting()[1] + sum(job.num_beams for job in self._jobs)

    def busy(self) -> bool:
        """Anything running or waiting."""
        with self._wake:
            return bool(self._jobs) or self.scheduler.has_waiting()

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
                while not (self._jobs or self._stop or self.scheduler.has_waiting()):
                    self._wake.wait()
                if self._stop:
                    return
            try:
                self.iterate()
            except Exception:  # noqa: BLE001 - already answered to every job that could be; the engine goes on
                traceback.print_exc(file=sys.stderr)

    # -- one iteration -------------------------------------------------------------------------------------------
    def iterate(self) -> None:
        admitted: list[Job] = []
        try:
            admitted = self._admit()
            self._move_rows()
            if admitted or self._keep_sources is not None:
                self._place_sources(admitted)
            if not self._jobs:
                return
            self._dispatch(*self._decode())
        except Exception as err:
            failed = self._jobs + [job for job in admitted if job not in self._jobs]
            self._jobs = []
            self._reset_batch()
            self.stats.running_rows = 0
            if not _fail(failed, f"generation failed: {err}"):
                raise

    def _reset_batch(self) -> None:
        # what the last step left to do before the next: self-attention rows to copy (destination rows, source
        # rows, columns in use) and the sources that continue, in their new order (None: all, in order)
        self._moves: tuple[list[int], list[int], int] | None = None
        self._keep_sources: list[int] | None = None

    def _admit(self) -> list[Job]:
        """Pending jobs that fit (cancelled ones answered and dropped), each with a fresh search."""
        admitted = [job for job in self.scheduler.admit(self._jobs) if not self._refuse_cancelled(job)]
        now = time.perf_counter()
        self.stats.queue_seconds += [now - job.submitted for job in admitted]
        for job in admitted:
            job.sequence = search.SourceSearch(self.decoding, job.max_new_tokens, job.num_beams)
        return admitted

    def _encode_into(self, sources: list[list[int]], first_row: int) -> None:
        """Encode the sources into the cross-attention rows from `first_row` on. Sources of similar length share an
        encoder call (length_groups), which pads them to its longest only."""
        for group in length_groups([len(source) for source in sources], ENCODER_CALL_TOKENS):
            outputs, mask = self._encode_group([sources[i] for i in group])
            rows = [first_row + i for i in group]
            columns = mask.shape[1]
            for buffer, output in zip(self._cross, outputs):
                buffer[rows, :, :columns] = output
            self._cross_mask[rows, :columns] = mask

    def _encode_group(self, sources: list[list[int]]) -> tuple[list[NDArray[Any]], NDArray[Any]]:
        """One encoder call, padded to the longest source."""
        ids = np.zeros((len(sources), max(map(len, sources))), np.int32)
        for i, source in enumerate(sources):
            ids[i, : len(source)] = source
        mask = (ids != 0).astype(np.int32)
        return self.encoder.run(self.cross_names, {contract.INPUT_IDS: ids, contract.ATTENTION_MASK: mask}), mask

    def _move_rows(self) -> None:
        """The last step's beam reorders and departures: each row that moves is copied (the columns in use)."""
        if self._moves is None:
            return
        destinations, origins, columns = self._moves
        for buffer in self._cache:
            buffer[destinations, :, :columns] = buffer[origins, :, :columns]  # the right side is read first
        self._moves = None

    def _place_sources(self, admitted: list[Job]) -> None:
        """The cross-attention rows of the next step: the sources that continue move into their new places (only
        those whose place changes are copied), then the admitted ones are encoded into the rows after them."""
        order, self._keep_sources = self._keep_sources, None
        if order is not None:
            moving = [(to, of) for to, of in enumerate(order) if to != of]
            if moving:
                destinations, origins = zip(*moving)
                for buffer in (*self._cross, self._cross_mask):
                    buffer[list(destinations)] = buffer[list(origins)]  # the right side is read first
        kept = len(self._jobs)
        self._jobs += admitted
        widest = max((len(job.source) for job in self._jobs), default=1)
        self._reserve_cross(len(self._jobs), widest, kept)
        if not admitted:
            return
        self._cross_mask[kept : len(self._jobs)] = 0
        self._encode_into([job.source for job in admitted], kept)

    def _reserve_cross(self, rows: int, widest: int, kept: int) -> None:
        """Cross-attention buffers of at least `rows` rows and a width that holds `widest` source tokens: grown by
        doubling rows and in steps of CROSS_COLUMNS_STEP columns; narrowed once the running sources fit in half
        the width (every column is attended to, masked or not). The first `kept` rows are kept."""
        have_rows, _, columns, _ = self._cross[0].shape
        needed = -(-widest // CROSS_COLUMNS_STEP) * CROSS_COLUMNS_STEP
        if needed > columns or needed <= columns // 2:
            columns = needed
        elif rows <= have_rows:
            return
        rows = _doubled(have_rows, rows)
        self._cross = [_resized(buffer, rows, columns, kept) for buffer in self._cross]
        mask, keep = np.zeros((rows, columns), np.int32), min(columns, self._cross_mask.shape[1])
        mask[:kept, :keep] = self._cross_mask[:kept, :keep]
        self._cross_mask = mask

    def _reserve(self, rows: int, columns: int) -> None:
        """Cache buffers of at least `rows` rows and `columns` columns; grown by doubling, contents kept."""
        have_rows, _, have_columns, _ = self._cache[0].shape
        if rows <= have_rows and columns <= have_columns:
            return
        rows, columns = _doubled(have_rows, rows), _doubled(have_columns, columns)
        self._cache = [_resized(buffer, rows, columns, have_rows) for buffer in self._cache]

    def _refuse_cancelled(self, job: Job) -> bool:
        if job.cancelled():
            job.on_tokens([], True)
            return True
        return False

    def _decode(self) -> tuple[NDArray[Any], NDArray[Any] | None]:
        """One decoder step for every row: each row's best TOP_K (log-probabilities, token ids), n-gram blocking
        applied (`_block_ngrams`); or, the rare step where that is not exact, all its log-probabilities (ids None:
        column = token id)."""
        beams = [beam for job in self._jobs for beam in job.state.row_beams()]
        rows = len(beams)
        positions = np.array([len(beam) - 1 for beam in beams], np.int64)
        self._reserve(rows, int(positions.max()) + 1)
        sources = len(self._jobs)
        cross_mask, cross_kv = self._cross_mask[:sources], [buffer[:sources] for buffer in self._cross]
        widths = [job.num_beams for job in self._jobs]
        if min(widths) != max(widths):  # the graph groups rows by source only when every source has as many
            cross_mask, *cross_kv = (np.repeat(array, widths, axis=0) for array in (cross_mask, *cross_kv))
        feeds = {
            contract.INPUT_IDS: np.array([[beam[-1]] for beam in beams], np.int32),
            contract.POSITIONS: positions,
            contract.CROSS_MASK: cross_mask,
            **dict(zip(self.cross_names, cross_kv)),
        }
        binding = self.decoder.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)
        wanted = [contract.TOP_LOG_PROBS, contract.TOP_IDS]
        wanted += [contract.LOG_PROBS] if self.decoding.no_repeat_ngram_size else []
        for name in wanted:
            binding.bind_output(name)
        for past, present, buffer in zip(self.past_names, self.present_names, self._cache):
            cache = buffer[:rows]  # contiguous: the leading rows
            binding.bind_cpu_input(past, cache)
            binding.bind_output(present, "cpu", 0, np.float32, list(cache.shape), cache.ctypes.data)
        self.decoder.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        scores, ids = outputs[0].numpy(), outputs[1].numpy()
        if self.decoding.no_repeat_ngram_size:  # all log-probabilities copied out only if they are needed
            scores, ids = self._block_ngrams(scores, ids, outputs[2].numpy)
        self.stats.steps += 1
        self.stats.running_rows = rows
        return scores, ids

    def _block_ngrams(
        self, top_scores: NDArray[Any], top_ids: NDArray[Any], all_log_probs: Callable[[], NDArray[Any]]
    ) -> tuple[NDArray[Any], NDArray[Any] | None]:
        """Tokens that would repeat an n-gram of their row's sequence get the lowest score, in place. A search of k
        beams reads each row's 2·k best tokens, and those are among its TOP_K best as long as no more than
        TOP_K − 2·k of them are blocked; most rows have none blocked. A step where some row has more blocked
        returns all the log-probabilities instead (blocked there), so the result is always exact."""
        n = self.decoding.no_repeat_ngram_size
        top_k = top_ids.shape[1]
        exact = True
        blocked: list[tuple[int, list[int]]] = []  # (row, its blocked tokens)
        row = 0
        for job in self._jobs:
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

    def _dispatch(self, scores: NDArray[Any], ids: NDArray[Any] | None) -> None:
        """Every source takes its step; finished and cancelled ones leave; the next step's rows are noted."""
        starts = np.cumsum([0] + [job.num_beams for job in self._jobs])
        parents = self._search(scores, ids, starts)
        leaving: set[int] = set()
        # Jobs that took their first step report first: their first token is what a streaming client waits for.
        for index in sorted(range(len(self._jobs)), key=lambda index: self._jobs[index].state.steps != 1):
            job = self._jobs[index]
            if job.cancelled():
                job.on_tokens([], True)
                leaving.add(index)
                continue
            try:
                self._report(job)
            except Exception as err:
                if job.on_error is None:
                    raise
                _fail([job], f"answering failed: {err}")
                leaving.add(index)
                continue
            if job.state.finished:
                leaving.add(index)
        staying = [index for index in range(len(self._jobs)) if index not in leaving]  # the jobs that continue
        order = self._fill_gaps(staying, starts.tolist())
        destinations: list[int] = []
        origins: list[int] = []
        columns = 0  # of the moving rows' caches in use
        row = 0  # where the next continuing source's rows start
        for index in order:
            job, start = self._jobs[index], int(starts[index])
            moved = [(row + j, start + p) for j, p in enumerate(parents[index]) if row + j != start + p]
            if moved:
                destinations += [to for to, _ in moved]
                origins += [of for _, of in moved]
                columns = max(columns, job.state.steps)  # one key cached per step taken
            row += job.num_beams
        self._moves = (destinations, origins, columns) if destinations else None
        self._keep_sources = None if order == list(range(len(self._jobs))) else order
        self._jobs = [self._jobs[index] for index in order]
        self.stats.running_rows = sum(job.num_beams for job in self._jobs)
        if not self._jobs:
            self._reset_batch()

    def _fill_gaps(self, staying: list[int], starts: list[int]) -> list[int]:
        """The order of the continuing jobs in the next step's rows. With one beam width, the jobs whose rows lie
        beyond the new end fill the places of those that left, and the others stay put: a finished source costs
        at most its own width in row copies, not a shift of every row after it. Mixed widths keep their order.
        The moves are worked out from the rows' actual places, so any order is correct; this one copies least."""
        widths = {self._jobs[index].num_beams for index in staying}
        if len(widths) != 1:
            return staying
        width = widths.pop()
        places = {starts[index] // width: index for index in staying}
        holes = (place for place in range(len(staying)) if place not in places)
        for place in sorted(place for place in places if place >= len(staying)):
            places[next(holes)] = places.pop(place)
        return [places[place] for place in range(len(staying))]

    def _search(self, scores: NDArray[Any], ids: NDArray[Any] | None, starts: NDArray[Any]) -> list[list[int]]:
        """Each source's step; the argmax and top-k work is done for all sources of one beam width at once.

        scores [R, C]: per row its best C log-probabilities with their token ids `ids` (C = TOP_K), or all of them
        (ids None: column = token id). A beam search's 2·k best over [k × V] are among its rows' best 2·k each.
        """
        if self.decoding.forced_eos:
            self._force_eos(scores, ids, starts)
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
                    parents[i] = self._jobs[i].state.take_token(token)
                continue
            beam_scores = np.stack([self._jobs[i].state.row_scores() for i in members])  # [n, k]
            flat = (scores[rows].reshape(len(members), k, columns) + beam_scores[:, :, None]).reshape(len(members), -1)
            picked, values = best_candidates(flat, 2 * k)  # indices into [k × C]
            if ids is not None:  # [k × TOP_K] positions → [k × V] positions
                tokens = np.take_along_axis(ids[rows].reshape(len(members), -1), picked, axis=1)
                picked = (picked // columns) * self.vocab + tokens
            for n, i in enumerate(members):
                parents[i] = self._jobs[i].state.take_candidates(picked[n], values[n], self.vocab)
        return parents

    def _force_eos(self, scores: NDArray[Any], ids: NDArray[Any] | None, starts: NDArray[Any]) -> None:
        """The rows of sources about to take their last step may only end (Hugging Face's forced_eos_token_id):
        eos at log-probability 0, every other token at the lowest score, in place."""
        eos = self.decoding.eos_id
        for job, start in zip(self._jobs, starts.tolist()):
            if job.state.steps != job.max_new_tokens - 1:
                continue
            rows = slice(start, start + job.num_beams)
            scores[rows] = LOWEST
            if ids is None:
                scores[rows, eos] = 0.0
            else:
                scores[rows, 0], ids[rows, 0] = 0.0, eos

    def _report(self, job: Job) -> None:
        seq = job.state
        if seq.steps == 1:  # its first token (or its end) is known now
            self.stats.first_token_seconds.append(time.perf_counter() - job.submitted)
        stable = seq.stable_tokens()
        if seq.result is not None:
            self.stats.generated_tokens += len(seq.result)
            job.on_tokens(stable[job.sent :], True)
        elif len(stable) > job.sent:
            job.on_tokens(stable[job.sent :], False)
            job.sent = len(stable)


def length_groups(lengths: list[int], call_cost: int) -> list[list[int]]:
    """The indices of `lengths` cut into groups, one encoder call each, that cost least in all: a call pads its
    sources to its longest and costs `call_cost` tokens more by itself. Groups are runs of the sorted lengths,
    so the best cut is found by dynamic programming over where each run starts."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    cost = [0.0] + [float("inf")] * len(order)  # cost[end]: the cheapest cut of the `end` shortest
    start_of = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        longest = lengths[order[end - 1]]
        for start in range(end):
            total = cost[start] + call_cost + (end - start) * longest
            if total < cost[end]:
                cost[end], start_of[end] = total, start
    groups, end = [], len(order)
    while end:
        groups.append(order[start_of[end] : end])
        end = start_of[end]
    return groups[::-1]


def _doubled(have: int, need: int) -> int:
    """A buffer's new size along one axis: as it is while `need` fits, else at least twice as large."""
    return have if need <= have else max(need, 2 * have)


def _resized(buffer: NDArray[Any], rows: int, columns: int, kept_rows: int) -> NDArray[Any]:
    """A zeroed [rows, H, columns, Dh] array holding buffer's first `kept_rows` rows, in the columns that fit."""
    out = np.zeros((rows, buffer.shape[1], columns, buffer.shape[3]), buffer.dtype)
    keep = min(columns, buffer.shape[2])
    out[:kept_rows, :, :keep] = buffer[:kept_rows, :, :keep]
    return out


def _fail(jobs: list[Job], message: str) -> bool:
    """Tell each job its step failed; False if one of them cannot be told (no on_error): the caller raises."""
    told = True
    for job in jobs:
        if job.on_error is None:
            told = False
            continue
        try:
            job.on_error(message)
        except Exception:  # noqa: BLE001 - the others must still be told
            traceback.print_exc(file=sys.stderr)
    return told
