"""The generation engine: iteration-level (continuous) batching over the step graphs of export/graphs/step_export.py.

One running batch holds the rows of every source being decoded (num_beams rows each). Each step:

1. admit: the scheduler (serving/engine/scheduler.py) names the waiting sources that join now; they are encoded
   (serving/engine/step_graphs.py: one encoder call per group of similar lengths) straight into the batch's rows
   after the running sources' (serving/engine/batch.py), with an empty self-attention cache. A decoder-only
   model's prompts are read first, a chunk per step beside the running rows, their shared prefixes taken from
   the prefix cache (serving/engine/prefill.py); each joins the batch once its keys are all cached;
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
import json
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from serving.engine import search
from serving.engine.batch import RunningBatch
from serving.engine.batch_search import block_ngrams, take_step
from serving.engine.config import EngineConfig
from serving.engine.job import Job, Output, deliver_all, fail
from serving.engine.prefill import Prefill, Prompt
from serving.engine.prefix_cache import PrefixCache
from serving.engine.scheduler import Scheduler
from serving.engine.search import Finish
from serving.engine.step_graphs import StepGraphs
from tasks import generation_contract as contract
from tasks.definition import EngineSettings

__all__ = ["Engine", "Job", "Output", "Stats"]


@dataclass
class Stats:
    """Counters the front model turns into metrics."""

    steps: int = 0
    running_rows: int = 0
    queue_seconds: list[float] = field(default_factory=list)  # per admitted job, drained by the reader
    first_token_seconds: list[float] = field(default_factory=list)  # per job, from submission; drained too
    # A decoder-only model's prompt tokens looked up in the prefix cache, and those found there (running totals)
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0

    def drain(self) -> tuple[list[float], list[float]]:
        """The waits and first-token times recorded since the last call."""
        waits, self.queue_seconds = self.queue_seconds, []
        firsts, self.first_token_seconds = self.first_token_seconds, []
        return waits, firsts


class Engine:
    def __init__(
        self,
        encoder: Path | None,
        decoder: Path,
        config: EngineConfig,
        threads: int = 1,
        settings: EngineSettings | None = None,
    ) -> None:
        """`encoder`: None for a decoder-only model; `config`: the checkpoint's decoding rules; `settings`: the
        task's [engine] table (max_rows, the scheduler's rules, the prompts' chunk and prefix cache)."""
        self.graphs = StepGraphs(encoder, decoder, threads)
        self.layout = self.graphs.layout
        self.decoding = config.decoding
        self.settings = settings or EngineSettings()
        self.max_rows = self.settings.max_rows
        self.stats = Stats()
        self.scheduler = Scheduler(self.settings)
        self.batch = RunningBatch(self.layout)
        self._encode_into = functools.partial(self.graphs.encode_into, self.batch)
        self.prefill: Prefill | None = None
        if self.layout.decoder_only:
            mib = self.settings.prefix_cache_mib
            cache = PrefixCache(mib << 20) if mib else None
            shape = (2 * self.layout.n_layers, self.layout.n_heads, self.layout.head_dim)
            self.prefill = Prefill(self.graphs.extend, shape, self.settings.prefill_chunk_tokens, cache)
        self._stop = False
        self._thread: threading.Thread | None = None
        self._deliver: Callable[[list[Output]], None] = deliver_all
        self._cancellations: queue.SimpleQueue[Job] = queue.SimpleQueue()

    @classmethod
    def load(
        cls, checkpoint: Path, precision: str = "fp32", threads: int = 1, settings: EngineSettings | None = None
    ) -> Engine:
        """The engine of a checkpoint folder: its graphs as the contract names them, its config.json's rules."""
        config = json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))
        *encoder, decoder = contract.graph_files(precision, bool(config.get("decoder_only")))
        first = Path(checkpoint) / encoder[0] if encoder else None
        return cls(first, Path(checkpoint) / decoder, EngineConfig.from_dict(config), threads, settings)

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
            return self.scheduler.waiting()[1] + sum(job.num_beams for job in self._taken())

    def busy(self) -> bool:
        """Anything running or waiting."""
        with self.scheduler.wake:
            return bool(self._taken()) or self.scheduler.has_waiting()

    def _taken(self) -> list[Job]:
        """The jobs admitted: running, or their prompts being read."""
        return self.batch.jobs + (self.prefill.jobs if self.prefill else [])

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
                while not (self._taken() or self._stop or self.scheduler.has_waiting()):
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
            if self.prefill is None:
                self.batch.join(admitted, self._encode_into)
            else:
                refused += self._read_prompts(admitted)
            if not self.batch.jobs:
                return refused
            scores, ids, all_log_probs = self._decode()
            jobs, starts = self.batch.jobs, self.batch.starts()
            parents = take_step(jobs, self.decoding, self.layout.vocab, scores, ids, starts, all_log_probs)
            return refused + self._report_and_leave(parents)
        except Exception as err:
            failed = self.batch.clear() + (self.prefill.clear() if self.prefill else [])
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

    def _read_prompts(self, admitted: list[Job]) -> list[Output]:
        """A decoder-only model's step of prompt reading: the admitted prompts start, one step's chunk is read,
        and the prompts read whole join the batch, their cache row copied into each of their beams' rows.
        Returns the answers of prompts cancelled while they waited."""
        assert self.prefill is not None
        cancelled = self.prefill.drop(lambda job: job.cancelled)
        self.prefill.add(admitted)
        read = {prompt.job: prompt for prompt in self.prefill.step()}
        cache = self.prefill.prefix_cache
        if cache is not None:
            self.stats.prompt_tokens, self.stats.cached_prompt_tokens = cache.queried_tokens, cache.hit_tokens

        def copy_rows(jobs: list[Job], first_row: int) -> None:
            starts = first_row + np.cumsum([0] + [job.num_beams for job in jobs])
            caches = self.batch.caches_for(int(starts[-1]), max(len(job.source) for job in jobs))
            for job, start, end in zip(jobs, starts, starts[1:]):
                prompt: Prompt = read[job]
                columns = len(prompt.tokens)
                for buffer, mine in zip(caches, prompt.caches):
                    buffer[start:end, :, :columns] = mine[0, :, :columns]

        self.batch.join(list(read), copy_rows)
        return [Output(job, [], Finish.CANCELLED) for job in cancelled]

    def _admit(self) -> tuple[list[Job], list[Output]]:
        """The waiting jobs that join now, each with a fresh search; and the answers of those cancelled meanwhile."""
        admitted: list[Job] = []
        refused: list[Output] = []
        now = time.perf_counter()
        for job in self.scheduler.admit(self._taken()):
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
