"""The real ``perf_analyzer`` (from the ``tritonclient==2.51.0`` wheel, installed by ``make perf-analyzer``).

``tritonclient`` 2.73 in the project venv ships an empty placeholder; 2.51.0 ships the binary, which needs
``libb64.so.0d`` and ``libcudart.so.12``. Both are inside ``nvidia_pytriton.libs`` under hashed names, so
they are linked under their plain names into ``<venv>/lib/perf-analyzer-libs``.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.profiles import ROOT
from serving.launcher.wheel import TritonWheel

DEFAULT_VENV = ROOT / ".cache" / "perf-analyzer"
NEEDED_LIBS = {"libb64.so.0d": "libb64-*.so.0d", "libcudart.so.12": "libcudart-*.so.12*"}


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer is missing or a run failed; the message says which and how to fix it."""


def locate(venv: Path = DEFAULT_VENV) -> tuple[Path, dict[str, str]]:
    """(binary, environment) ready to run; links the two libraries it needs on first use."""
    binary = Path(venv) / "bin" / "perf_analyzer"
    if not binary.is_file() or binary.stat().st_size < 1_000_000:
        raise PerfAnalyzerError(f"{binary} is missing (or the empty placeholder): run `make perf-analyzer`")
    wheel_libs = TritonWheel.locate().libs
    link_dir = Path(venv) / "lib" / "perf-analyzer-libs"
    link_dir.mkdir(parents=True, exist_ok=True)
    for name, pattern in NEEDED_LIBS.items():
        link = link_dir / name
        if link.exists():
            continue
        found = sorted(Path(wheel_libs).glob(pattern))
        if not found:
            raise PerfAnalyzerError(f"no {pattern} in {wheel_libs}: is nvidia-pytriton installed?")
        link.symlink_to(found[0])
    env = {**os.environ, "LD_LIBRARY_PATH": f"{link_dir}:{wheel_libs}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    return binary, env


def write_input_data(texts: list[str], path: Path, name: str = "TEXT") -> Path:
    """perf_analyzer's ``--input-data`` JSON: one BYTES [1] tensor per request, cycling through the texts."""
    path.write_text(json.dumps({"data": [{name: [text]} for text in texts]}, ensure_ascii=False), encoding="utf-8")
    return path


UNSTABLE = "Failed to obtain stable measurement"
RETRIES = 2  # each doubles the window


def run(
    grpc_url: str, model: str, concurrency: int, input_data: Path, window_ms: int, venv: Path = DEFAULT_VENV
) -> dict[str, Any]:
    """One measurement at one concurrency: throughput (infer/s) and latency percentiles (ms).

    Three windows are accepted as they come (the spread across repetitions is ours to report), but a window in
    which no request finished (a server stalling for longer than the window) makes perf_analyzer give up: the
    measurement is then repeated with a window twice as long, up to RETRIES times. ``window_ms`` in the result
    says which window was used.
    """
    binary, env = locate(venv)
    for attempt in range(RETRIES + 1):
        window = window_ms * 2**attempt
        with tempfile.TemporaryDirectory(prefix="perf-analyzer-") as tmp:
            report = Path(tmp) / "report.csv"
            command = [str(binary), "-i", "grpc", "-u", grpc_url, "-m", model, "-b", "1"]
            command += [f"--concurrency-range={concurrency}:{concurrency}", f"--input-data={input_data}"]
            command += [f"--measurement-interval={window}", "--stability-percentage=1000", "--max-trials=3"]
            command += ["-f", str(report)]
            result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120 + 10 * window / 1000)
            if result.returncode == 0 and report.is_file():
                with open(report, encoding="utf-8") as f:
                    return _parse(next(csv.DictReader(f)), window)
        output = result.stdout + result.stderr
        if UNSTABLE not in output or attempt == RETRIES:
            tail = "\n".join(output.splitlines()[-15:])
            raise PerfAnalyzerError(
                f"perf_analyzer failed (exit {result.returncode}) for {model} c={concurrency}:\n{tail}"
            )
    raise AssertionError("unreachable")


def _parse(row: dict[str, str], window_ms: int) -> dict[str, Any]:
    us = 1e-3  # perf_analyzer reports microseconds
    return {
        "throughput": float(row["Inferences/Second"]),
        "p50_ms": float(row["p50 latency"]) * us,
        "p90_ms": float(row["p90 latency"]) * us,
        "p99_ms": float(row["p99 latency"]) * us,
        "window_ms": window_ms,
    }
