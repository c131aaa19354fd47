"""Bring back a model whose Python-backend stub process died.

Triton 2.51's Python backend does not restart a stub that crashed or was killed (by the OOM killer, a segfault in
a native library, an operator's ``kill``). The dead instance stays in the model, and every request routed to it
fails after a one-second health check with ``Stub process 'sentiment_0_0' is not healthy`` for as long as the
server runs (measured: one failed request per second under load, indefinitely).

The watchdog polls the server's process group, notices a stub that is gone, and reloads that model through the
model-repository API, which the launcher keeps locked with its private key. Triton ignores a load request for a
model whose files and config did not change, so the reload sends the model's current config with one parameter
changed (``ropeserve_reload``): Triton then starts fresh instances, switches new requests to them and retires the
old ones when their in-flight requests are done. Measured: failures stop within about 3 s of the kill.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .control import http_status, load_model, model_config

STUB_BINARY = "triton_python_backend_stub"
RELOAD_PARAMETER = "ropeserve_reload"


@dataclass(frozen=True)
class Stub:
    """One Python-backend stub process: which model (and instance) it runs."""

    pid: int
    model: str
    instance: str


def command_line(pid: int) -> list[str]:
    """argv of a process, [] when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode("utf-8", errors="replace").rstrip("\0").split("\0")
    except OSError:
        return []


def find_stubs(pids: list[int]) -> list[Stub]:
    """The stubs among ``pids``. A stub's argv is ``stub <repo>/<model>/<version>/<file> <shm> … <instance> …``."""
    stubs = []
    for pid in pids:
        argv = command_line(pid)
        if len(argv) > 1 and argv[0].endswith(STUB_BINARY):
            model_file = Path(argv[1])
            instance = argv[8] if len(argv) > 8 else ""
            stubs.append(Stub(pid, model_file.parent.parent.name, instance))
    return stubs


def _say(message: str) -> None:
    print(f"ropeserve: {message}", file=sys.stderr, flush=True)


class StubWatchdog(threading.Thread):
    """Poll every ``interval_s``; reload each model that lost a stub. ``stop()`` ends the thread.

    ``members()`` lists the live processes of the server's group; ``http_url`` and ``control_headers`` reach the
    (locked) model-repository API. A model that lost a stub is reloaded as soon as it reports ready; one that
    stays not ready for ``patience_s`` (being unloaded on purpose, or failed) is left alone.
    """

    def __init__(
        self,
        members: Callable[[], list[int]],
        http_url: str,
        control_headers: dict[str, str],
        interval_s: float = 0.5,
        patience_s: float = 30.0,
        log: Callable[[str], None] = _say,
    ) -> None:
        super().__init__(name="ropeserve-stub-watchdog", daemon=True)
        self.members = members
        self.http_url = http_url
        self.control_headers = control_headers
        self.interval_s = interval_s
        self.log = log
        self.patience_s = patience_s
        self.reloads: dict[str, int] = {}  # model → reloads done, for logs, tests and metrics
        self._stopped = threading.Event()
        self._watched: dict[int, Stub] = {}  # pid → stub, from the last look
        self._retiring: set[int] = set()  # old instances of a reloaded model: they exit on their own
        self._pending: dict[str, float] = {}  # model that lost a stub → when that was noticed
        self._abandoned: set[str] = set()  # lost a stub and was not brought back: requests to it fail

    def problem(self) -> str | None:
        """Why the server cannot be trusted to answer (a stub dead longer than ``patience_s``), or None.

        What the launcher's liveness answer reports: Triton's own ``/v2/health/live`` stays 200 with a dead stub.
        """
        now = time.monotonic()
        pending = list(self._pending.items())  # one C-level copy: the watchdog thread may be changing it
        broken = sorted(set(self._abandoned) | {m for m, since in pending if now - since > self.patience_s})
        if not broken:
            return None
        return f"the Python-backend stub of {', '.join(broken)} died and was not brought back"

    def stop(self) -> None:
        self._stopped.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5)

    def run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                self._check()
            except Exception as exc:  # noqa: BLE001 - a watchdog that dies silently watches nothing
                self.log(f"stub watchdog: {type(exc).__name__}: {exc}")

    def _check(self) -> None:
        """One look at the process group: note each model that lost a stub, reload those that are ready."""
        alive = set(self.members())
        now = time.monotonic()
        # Stubs as found now: a process listed alive can die before its argv is read (it then reads empty), and it
        # must still count as a watched stub that is gone, or its death would never be noticed.
        stubs = find_stubs(sorted(alive))
        found = {stub.pid for stub in stubs}
        dead = [s for pid, s in self._watched.items() if pid not in found and pid not in self._retiring]
        for model in sorted({stub.model for stub in dead} - set(self._pending)):
            pids = ", ".join(str(s.pid) for s in dead if s.model == model)
            self.log(f"the Python-backend stub of model '{model}' (pid {pids}) died")
            self._pending[model] = now
        for model, since in sorted(self._pending.items()):
            if self._stopped.is_set():
                return
            status = self.ready_status(model)
            if status != 200:  # being unloaded on purpose, or failed; None: the server did not answer in time
                if now - since > self.patience_s:
                    self.log(f"'{model}' is not ready (HTTP {status}) {self.patience_s:.0f} s on; leaving it alone")
                    del self._pending[model]
                    self._abandoned.add(model)
                continue
            self.log(f"reloading '{model}'")
            try:
                self.reload(model)
            except (OSError, ValueError) as exc:  # server busy or stopping, or the model vanished: try again
                self.log(f"reloading '{model}' failed: {exc}")
                continue
            del self._pending[model]
            self._retiring |= {pid for pid, stub in self._watched.items() if stub.model == model}
            self.log(f"model '{model}' reloaded")
        self._abandoned -= {stub.model for stub in stubs if stub.pid not in self._watched}  # loaded again since
        self._watched = {stub.pid: stub for stub in stubs}
        self._retiring &= found

    def reload(self, model: str) -> None:
        """Load ``model`` again with a changed reload parameter, so Triton really builds new instances."""
        config = model_config(self.http_url, model)
        count = self.reloads.get(model, 0) + 1
        config.setdefault("parameters", {})[RELOAD_PARAMETER] = {"string_value": str(count)}
        load_model(self.http_url, self.control_headers, model, config)
        self.reloads[model] = count

    def ready_status(self, model: str) -> int | None:
        """HTTP status of the model's readiness (200: ready), None when the server did not answer."""
        return http_status(f"{self.http_url}/v2/models/{model}/ready", timeout_s=5)
