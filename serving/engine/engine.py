"""The generation engine: iteration-level (continuous) batching over the step graphs of export/graphs/step_export.py.

One running batch holds the rows of every source being decoded (num_beams rows each). Each step:

1. admit: the scheduler (serving/engine/scheduler.py) names the waiting sources that join now; they are encoded
   (serving/engine/step_graphs.py: one encoder call per group of similar lengths) straight into the batch's rows
   after the running sources' (serving/engine/batch.py), with an empty self-attention cache;
2. decode: one decoder call for every row, each at its own position (the keys it has cached);
3. search: each source reads its rows' log-probabilities (serving/engine/batch_search.py and search.py) and names
   the rows its next step continues; finished, cancelled and failed sources leave at once.

`Engine.step` returns what each source has to report (`Output`: its newly stable tokens, and why it ended), which
`Output.deliver` hands to the job's callbacks, in the thread that delivers: the front model delivers on its
response thread, so that detokenizing and assembling answers never hold up the next step.

Nothing is padded to a longer neighbour beyond the source padding of the cross-attention, and settings
(max_new_tokens, num_beams) are per source, so no grouping by settings.

`Engine.run_until_idle` drives the loop in the caller's thread (tests, offline use); `Engine.start` runs it in a
background thread, which the Triton front model does.
"""

from __future__ import annotations

import functools
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from numpy.typing import NDArray

from serving.engine import search
from serving.engine.batch import RunningBatch
from serving.engine.batch_search import block_ngrams, take_step
from serving.engine.config import EngineConfig
from serving.engine.job import Job, Output, deliver_all, fail
from serving.engine.scheduler import Scheduler
from serving.engine.search import Finish
from serving.engine.step_graphs import StepGraphs
from tasks.definition import EngineSettings

__all__ = ["Engine", "Job", "Output", "Stats"]


@dataclass
class Stats:
    """Counters the front model turns into metrics."""

    steps: int = 0
    running_rows: int = 0
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
        settings: EngineSettings | None = None,
    ) -> None:
        """`config`: the checkpoint's decoding rules; `settings`: the task's [engine] table (max_rows, the
        scheduler's rules)."""
        self.graphs = StepGraphs(encoder, decoder, threads)
        self.layout = self.graphs.layout
        self.decoding = config.decoding
        self.settings = settings or EngineSettings()
        self.max_rows = self.settings.max_rows
        self.stats = Stats()
        self.scheduler = Scheduler(self.settings)
        self.batch = RunningBatch(self.layout)
        read_sources = self.graphs.prefill_into if self.layout.decoder_only else self.graphs.encode_into
        self._encode_into = functools.partial(read_sources, self.batch)
        self._stop = False
        self._thread: threading.Thread | None = None
        self._deliver: Callable[[list[Output]], None] = deliver_all
        self._cancellations: queue.SimpleQueue[Job] = queue.SimpleQueue()

    # -- submitting --------------------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        if job.sampling is not None and job.num_beams != 1:
            raise ValueError(f"a sampled job has one beam, got num_beams={job.num_beams}")
        if not 1 <= job.num_beams <= self.layout.max_beams:
            raise ValueError(
                f"num_beams must be between 1 and {self.layout.max_beams} (the decoder returns {self.layout.top_k} "
                f"tokens per row), got {job.num_beams}"
            )
        self.scheduler.submit(job)

    def cancel(self, jobs: Iterable[Job]) -> None:
        """End these jobs at the next step (their clients went away), waiting or running: each answers CANCELLED
        and leaves. From any thread: the engine's thread takes the cancellations off a queue as a step starts."""
        for job in jobs:
            self._cancellations.put(job)

    def queued_rows(self) -> int:
        """Rows running and waiting: the engine's backlog, which the front model bounds."""
        with self.scheduler.wake:
            return self.scheduler.waiting()[1] + self.batch.rows

    def busy(self) -> bool:
        """Anything running or waiting."""
        with self.scheduler.wake:
            return bool(self.batch.jobs) or self.scheduler.has_waiting()

    # -- running -------------------------------------------------------------------------------------------------
    def start(self, deliver: Callable[[list[Output]], None] = deliver_all) -> None:
        """Step in a background thread while there is work; each step's outputs go to `deliver` (by default
        delivered in that thread)."""
        self._deliver = deliver
        self._thread = threading.Thread(target=self._loop, name="generation-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self.scheduler.wake:
            self._stop = True
            self.scheduler.wake.notify()
        if self._thread is not None:
            self._thread.join()

    def run_until_idle(self) -> None:
        """Step until nothing is pending or running (in the caller's thread)."""
        while self.busy():
            self.iterate()

    def _loop(self) -> None:
        wake = self.scheduler.wake
        while True:
            with wake:
                while not (self.batch.jobs or self._stop or self.scheduler.has_waiting()):
                    wake.wait()
                if self._stop:
                    return
            try:
                self._deliver(self.step())
            except Exception:  # noqa: BLE001 - already answered to every job that could be; the engine goes on
                traceback.print_exc(file=sys.stderr)

    def iterate(self) -> None:
        """One step, its outputs delivered to the jobs' callbacks in this thread."""
        deliver_all(self.step())

    # -- one step ------------------------------------------------------------------------------------------------
    def step(self) -> list[Output]:
        """Admit, decode, search; the outputs of the jobs that have something to report. A failure ends every
        job it touched (an ERROR output each), and the engine goes on as if they had never come; it raises
        instead if a job could not be told (no on_error: offline use)."""
        admitted: list[Job] = []
        try:
            self._take_cancellations()
            admitted, refused = self._admit()
            self.batch.join(admitted, self._encode_into)
            if not self.batch.jobs:
                return refused
            scores, ids, all_log_probs = self._decode()
            jobs, starts = self.batch.jobs, self.batch.starts()
            parents = take_step(jobs, self.decoding, self.layout.vocab, scores, ids, starts, all_log_probs)
            return refused + self._report_and_leave(parents)
        except Exception as err:
            failed = self.batch.clear()
            failed += [job for job in admitted if job not in failed]
            self.stats.running_rows = 0
            message = f"generation failed: {err}"
            if any(job.on_error is None for job in failed):
                fail(failed, message)
                raise
            return [Output(job, [], Finish.ERROR, message) for job in failed]

    def _take_cancellations(self) -> None:
        while True:
            try:
                self._cancellations.get_nowait().cancelled = True
            except queue.Empty:
                return

    def _admit(self) -> tuple[list[Job], list[Output]]:
        """The waiting jobs that join now, each with a fresh search; and the answers of those cancelled meanwhile."""
        admitted: list[Job] = []
        refused: list[Output] = []
        now = time.perf_counter()
        for job in self.scheduler.admit(self.batch.jobs):
            if job.cancelled:
                refused.append(Output(job, [], Finish.CANCELLED))
                continue
            self.stats.queue_seconds.append(now - job.submitted)
            prefix = job.source if self.layout.decoder_only else None  # a decoder-only model continues its prompt
            job.sequence = search.SourceSearch(self.decoding, job.max_new_tokens, job.num_beams, prefix, job.sampling)
            admitted.append(job)
        return admitted, refused

    def _decode(self) -> tuple[NDArray[Any], NDArray[Any] | None, Callable[[], NDArray[Any]]]:
        """One decoder step for every row: each row's best TOP_K (log-probabilities, token ids), n-gram blocking
        applied, or, the rare step where that is not exact, all its log-probabilities (ids None); and how to read
        all of them (a sampled row draws from its whole row), copied out once, on demand."""
        n = self.decoding.no_repeat_ngram_size
        sampled = any(job.sampling is not None for job in self.batch.jobs)
        scores, top_ids, read_all = self.graphs.decode(self.batch, with_all_log_probs=n > 0 or sampled)
        self.stats.steps += 1
        all_log_probs = _once(read_all or _nothing)
        if n == 0:
            return scores, top_ids, all_log_probs
        blocked, ids = block_ngrams(self.batch.jobs, n, scores, top_ids, all_log_probs)
        return blocked, ids, all_log_probs

    def _report_and_leave(self, parents: list[list[int]]) -> list[Output]:
        """Each job's output; finished, cancelled and failed jobs leave the batch. Jobs that took their first step
        report first: their first token is what a streaming client waits for."""
        outputs: list[Output] = []
        leaving: set[int] = set()
        for index, job in enumerate(self.batch.jobs):
            output = None if job.failed else self._output(job)
            if output is not None:
                outputs.append(output)
            if job.failed or (output is not None and output.finish is not None):
                leaving.add(index)
        self.batch.leave(leaving, parents)
        self.stats.running_rows = self.batch.rows
        return sorted(outputs, key=lambda output: output.job.state.steps != 1)

    def _output(self, job: Job) -> Output | None:
        if job.cancelled:
            return Output(job, [], Finish.CANCELLED)
        state = job.state
        if state.steps == 1:  # its first token (or its end) is known now
            self.stats.first_token_seconds.append(time.perf_counter() - job.submitted)
        stable = state.stable_tokens()
        new, job.sent = stable[job.sent :], len(stable)
        if state.finish is not None or new:
            return Output(job, new, state.finish)
        return None


def _nothing() -> NDArray[Any]:
    raise RuntimeError("the step did not keep its log-probabilities")


def _once(read: Callable[[], NDArray[Any]]) -> Callable[[], NDArray[Any]]:
    """`read`, called at most once: its array is reused (and may be changed in place by the first reader)."""
    kept: list[NDArray[Any]] = []

    def first() -> NDArray[Any]:
        if not kept:
            kept.append(read())
        return kept[0]

    return first
