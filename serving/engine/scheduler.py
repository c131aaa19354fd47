"""The work waiting for the generation engine's running batch, and the rules that admit it.

- Jobs wait per group (a request's sentences share one) and the groups take turns, round robin, interactive
  groups first: a one-line request is not queued behind every sentence of someone's document.
- Bulk jobs yield rows to interactive ones: a step's time grows with its rows, and an interactive request's
  latency with it (the documents bench section measures the result: a single sentence's p50 beside four
  50-sentence documents, against idle). While interactive jobs come, bulk jobs hold at most
  `bulk_rows_beside_interactive` rows; "while" lasts `interactive_hold_s` after the last interactive job arrived,
  so the batch is not refilled with bulk rows in the gap between one request of a client and its next. Both are
  the task's `[engine]` settings (tasks/definition.py, EngineSettings).
- An encoder call costs about the same for one source or eight: while the batch is nearly full, newcomers wait
  for a quarter of it to free up (a few steps) and are encoded together. An interactive job does not wait.

The front model's threads submit; the engine's thread admits. ``wake`` is the one lock of both sides, and the
condition the engine's thread sleeps on while there is nothing to do.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence

from serving.engine.job import Job
from tasks.definition import EngineSettings


class Scheduler:
    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.max_rows = settings.max_rows
        self.wake = threading.Condition()
        self._waiting: dict[object, deque[Job]] = {}  # per group, in the order the groups take turns
        self._interactive_at = -float("inf")  # when the last interactive job was submitted

    def submit(self, job: Job) -> None:
        with self.wake:
            if not job.bulk:
                self._interactive_at = time.monotonic()
            key = id(job) if job.group is None else job.group
            self._waiting.setdefault(key, deque()).append(job)
            self.wake.notify()

    def waiting(self) -> tuple[int, int]:
        """Texts and rows (texts x beams) waiting to join the running batch."""
        with self.wake:
            jobs = [job for jobs in self._waiting.values() for job in jobs]
            return len(jobs), sum(job.num_beams for job in jobs)

    def has_waiting(self) -> bool:
        with self.wake:
            return bool(self._waiting)

    def admit(self, running: Sequence[Job]) -> list[Job]:
        """The waiting jobs that join the `running` ones now, in the order they took their turns."""
        with self.wake:
            rows = sum(job.num_beams for job in running)
            interactive_waiting = any(not jobs[0].bulk for jobs in self._waiting.values())
            if rows and self.max_rows - rows < self.max_rows // 4 and not interactive_waiting:
                return []
            admitted = self.take_turns(rows, sum(job.num_beams for job in running if job.bulk))
            if not admitted and self._waiting and not running:  # one source wider than max_rows
                admitted.append(self._pop(next(iter(self._waiting))))
            return admitted

    def bulk_rows(self) -> int:
        """How many rows bulk jobs may hold now: all of them, unless an interactive job arrived in the last
        `interactive_hold_s` (then `bulk_rows_beside_interactive`)."""
        if time.monotonic() - self._interactive_at < self.settings.interactive_hold_s:
            return self.settings.bulk_rows_beside_interactive
        return self.max_rows

    def take_turns(self, rows: int, bulk: int) -> list[Job]:
        """Waiting jobs that fit beside `rows` rows in use (`bulk` of them bulk), one per group in turn (round
        robin, interactive groups first); a group that had its turn goes to the back of the line. Bulk jobs are
        admitted only while they hold fewer than :meth:`bulk_rows` rows."""
        with self.wake:
            admitted: list[Job] = []
            bulk_limit = self.bulk_rows()
            while self._waiting:
                took = False
                for key in sorted(self._waiting, key=lambda key: self._waiting[key][0].bulk):  # stable
                    jobs = self._waiting[key]
                    width = jobs[0].num_beams
                    if rows + width > self.max_rows or (jobs[0].bulk and bulk + width > bulk_limit):
                        continue
                    job = self._pop(key)
                    rows += width
                    bulk += width if job.bulk else 0
                    admitted.append(job)
                    took = True
                    if key in self._waiting:  # to the back of the line
                        self._waiting[key] = self._waiting.pop(key)
                if not took:
                    return admitted
            return admitted

    def _pop(self, key: object) -> Job:
        jobs = self._waiting[key]
        job = jobs.popleft()
        if not jobs:
            del self._waiting[key]
        return job
