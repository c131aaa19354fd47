"""The stub watchdog's decisions, on real processes that look like stubs: which model to reload, and when.

The end-to-end case (a real stub killed under load, the real server reloading it) is in
tests/reliability/test_faults.py; here the server's answers are scripted, to reach the moments that are rare there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from serving.launcher.watchdog import STUB_BINARY, StubWatchdog, command_line, find_stubs


def start_fake_stub(repository: Path, model: str) -> subprocess.Popen:
    """A process whose argv reads like a Python-backend stub of `model`: `…/triton_python_backend_stub <model.py>`."""
    script = repository / model / "1" / "model.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("while :; do sleep 1; done\n")
    process = subprocess.Popen([f"/opt/tritonserver/backends/python/{STUB_BINARY}", str(script)], executable="/bin/sh")
    deadline = time.monotonic() + 10
    while len(command_line(process.pid)) < 2 and time.monotonic() < deadline:  # argv appears once exec is done
        time.sleep(0.01)
    return process


class ScriptedWatchdog(StubWatchdog):
    """A watchdog whose server answers readiness from a script, and which records its reloads."""

    def __init__(self, stubs: list[subprocess.Popen], ready: list[int | None], patience_s: float = 30.0) -> None:
        super().__init__(
            lambda: [p.pid for p in stubs if p.poll() is None], "http://127.0.0.1:9", {}, patience_s=patience_s
        )
        self.ready = ready
        self.lines: list[str] = []
        self.log = self.lines.append
        self.reloaded: list[str] = []

    def ready_status(self, model: str) -> int | None:
        return self.ready.pop(0)

    def reload(self, model: str) -> None:
        self.reloaded.append(model)


@pytest.fixture
def stubs(tmp_path):
    started: list[subprocess.Popen] = []

    def start(model: str) -> subprocess.Popen:
        started.append(start_fake_stub(tmp_path, model))
        return started[-1]

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def kill(process: subprocess.Popen) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


def test_fake_stubs_are_recognized(stubs) -> None:
    process = stubs("sentiment")
    (stub,) = find_stubs([process.pid, os.getpid()])
    assert (stub.pid, stub.model) == (process.pid, "sentiment")


def test_a_dead_stub_is_reloaded_once_the_server_answers(stubs) -> None:
    victim, other = stubs("sentiment"), stubs("translate")
    watchdog = ScriptedWatchdog([victim, other], ready=[None, 503, 200])
    watchdog._check()  # first look: learns the stubs
    kill(victim)
    watchdog._check()  # the server does not answer in time: no reload yet, and the death is not forgotten
    watchdog._check()  # not ready for a moment
    assert watchdog.reloaded == []
    watchdog._check()
    assert watchdog.reloaded == ["sentiment"]
    assert watchdog.ready == [] and watchdog._pending == {}
    watchdog._check()  # nothing more to do
    assert watchdog.reloaded == ["sentiment"]
    assert any("(pid " in line and "'sentiment'" in line for line in watchdog.lines)


def test_a_stub_that_dies_while_the_group_is_read_is_still_noticed(stubs) -> None:
    """The process list names the stub, then it dies before its argv is read (which then reads empty): the death
    must be noticed then, not lost from the watched stubs for good (seen under load: no reload for 30 s)."""
    victim, other = stubs("sentiment"), stubs("translate")
    watchdog = ScriptedWatchdog([victim, other], ready=[200])
    watchdog._check()
    listed = [victim.pid, other.pid]
    kill(victim)
    watchdog.members = lambda: listed  # read before the kill
    watchdog._check()
    assert watchdog.reloaded == ["sentiment"]


def test_a_model_that_stays_not_ready_is_left_alone_after_the_patience(stubs) -> None:
    victim = stubs("summarize")
    watchdog = ScriptedWatchdog([victim], ready=[400, 400], patience_s=0.0)
    watchdog._check()
    kill(victim)
    watchdog._check()  # noticed; not ready, and the patience (0 s) is not over within the same look
    assert watchdog._pending
    watchdog._check()
    assert watchdog.reloaded == [] and watchdog._pending == {}
    assert any("leaving it alone" in line for line in watchdog.lines)


def test_liveness_names_a_model_whose_stub_stayed_dead_until_it_comes_back(stubs) -> None:
    victim, other = stubs("summarize"), stubs("translate")
    watchdog = ScriptedWatchdog([victim, other], ready=[400, 400], patience_s=0.0)
    watchdog._check()
    assert watchdog.problem() is None  # all stubs alive
    kill(victim)
    watchdog._check()  # noticed, within its patience: a reload may still bring it back
    watchdog._check()  # left alone: requests routed to it fail for as long as the server runs
    assert "summarize" in (watchdog.problem() or "") and "translate" not in watchdog.problem()
    watchdog.members = lambda: [other.pid, stubs("summarize").pid]  # loaded again (by an operator, say)
    watchdog._check()
    assert watchdog.problem() is None


def test_a_reloaded_model_is_live(stubs) -> None:
    victim = stubs("sentiment")
    watchdog = ScriptedWatchdog([victim], ready=[200])
    watchdog._check()
    kill(victim)
    watchdog._check()
    assert watchdog.reloaded == ["sentiment"] and watchdog.problem() is None
