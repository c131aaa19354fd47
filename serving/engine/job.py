"""One source text submitted to the generation engine, and what it reports back."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from serving.engine.sampling import Sampling
from serving.engine.search import Finish, SourceSearch

TokenCallback = Callable[[list[int], Finish | None], None]  # (newly stable tokens, why it ended on its last)


@dataclass(eq=False)
class Job:
    """One source text submitted to the engine. `on_tokens` receives the tokens every possible answer starts
    with as they become known, and the rest with why it ended (after Engine.cancel: none, CANCELLED). If its step
    fails (or its own callback raises), `on_error` gets the message instead and the job leaves; a job without
    one makes the failure raise (offline use)."""

    source: list[int]  # token ids, truncated and ending with eos
    max_new_tokens: int
    num_beams: int
    on_tokens: TokenCallback
    on_error: Callable[[str], None] | None = None
    sampling: Sampling | None = None  # drawn instead of searched (one beam); None: greedy or beam search
    submitted: float = field(default_factory=time.perf_counter)
    # The jobs of one request (a document's sentences) share a group, and groups take turns; a bulk job (a
    # document's, or a large batch's) yields to interactive ones (serving/engine/scheduler.py).
    group: object = None
    bulk: bool = False
    sequence: SourceSearch | None = None  # set when it joins the running batch
    sent: int = 0  # tokens already passed to on_tokens
    cancelled: bool = False  # set by the engine's thread (Engine.cancel): it answers CANCELLED and leaves
    failed: bool = False  # told on_error: it leaves at the next step, and hears nothing more

    @property
    def state(self) -> SourceSearch:
        """Its search, once it joined the running batch (what every step works on)."""
        if self.sequence is None:
            raise RuntimeError("the job has not joined the running batch")
        return self.sequence


@dataclass(frozen=True)
class Output:
    """What one step has for one job: the tokens that became stable, and, on its last, why it ended (with the
    message when its step failed)."""

    job: Job
    tokens: list[int]
    finish: Finish | None = None
    error: str = ""

    def deliver(self) -> None:
        """Pass it to the job's callback (on_error for a failed step); if on_tokens raises, the job fails
        (on_error) and leaves the batch. Whichever thread calls this runs the callbacks."""
        if self.finish is Finish.ERROR:
            fail([self.job], self.error)
            return
        try:
            self.job.on_tokens(self.tokens, self.finish)
        except Exception as err:
            if not fail([self.job], f"answering failed: {err}"):
                raise


def deliver_all(outputs: Sequence[Output]) -> None:
    for output in outputs:
        output.deliver()


def fail(jobs: Sequence[Job], message: str) -> bool:
    """Tell each job it failed (it leaves the batch at the next step); False if one of them cannot be told (no
    on_error): the caller raises."""
    told = True
    for job in jobs:
        job.failed = True
        if job.on_error is None:
            told = False
            continue
        try:
            job.on_error(message)
        except Exception:  # noqa: BLE001 - the others must still be told
            traceback.print_exc(file=sys.stderr)
    return told
