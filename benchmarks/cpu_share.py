"""Where the CPU goes while a load runs: cores used by tritonserver, each model's Python stubs and the load tool.

Read from /proc (utime + stime of every process whose command line names one of those), sampled while the load
runs, so that processes that start or end during it are counted for the time they were seen.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
STUB = "triton_python_backend_stub"


def process_kind(pid: int) -> str | None:
    """ "tritonserver", "stub <model>", "perf_analyzer", or None for a process that is none of these."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    if argv[0].endswith("tritonserver"):
        return "tritonserver"
    if argv[0].endswith(STUB) and len(argv) > 1:  # argv[1]: <repository>/<model>/<version>/model.py
        return f"stub {Path(argv[1]).parent.parent.name}"
    if argv[0].endswith("perf_analyzer"):
        return "perf_analyzer"
    return None


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # utime, stime


def cores_during(load: Callable[[], Any], interval_s: float = 0.1) -> tuple[Any, dict[str, float]]:
    """Run ``load`` and return its result with the cores each process kind used meanwhile (CPU s / wall s)."""
    start: dict[int, float] = {}
    last: dict[int, tuple[str, float]] = {}
    for pid in _pids():
        kind, used = process_kind(pid), cpu_seconds(pid)
        if kind and used is not None:
            start[pid], last[pid] = used, (kind, used)
    done = threading.Event()

    def sample() -> None:
        for pid in _pids():
            kind = last[pid][0] if pid in last else process_kind(pid)
            used = cpu_seconds(pid) if kind else None
            if kind and used is not None:
                last[pid] = (kind, used)

    def sample_until_done() -> None:
        while not done.wait(interval_s):
            sample()

    sampler = threading.Thread(target=sample_until_done, daemon=True)
    began = time.monotonic()
    sampler.start()
    try:
        result = load()
    finally:
        done.set()
        sampler.join()
    wall = time.monotonic() - began
    sample()  # the end reading: the last periodic one may be up to interval_s old
    cores: dict[str, float] = {}
    for pid, (kind, used) in last.items():
        cores[kind] = cores.get(kind, 0.0) + (used - start.get(pid, 0.0)) / wall
    return result, cores


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]
