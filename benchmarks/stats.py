"""Timing and statistics shared by every comparison.

The machine is shared and noisy, so a single number means little: each variant is measured several times,
its repetitions interleaved with those of the variants it is compared with (so a burst of foreign load hits
all of them alike), and the report gives the median with the spread (min, max, interquartile range).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

from tqdm import tqdm


def summarize(values: list[float]) -> dict[str, float]:
    """Median and spread of repeated measurements of one quantity."""
    if not values:
        raise ValueError("no measurements to summarize")
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else [ordered[0]] * 3
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "q1": quartiles[0],
        "q3": quartiles[2],
        "n": len(ordered),
        "values": values,
    }


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation, as perf_analyzer and numpy report it."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def rate(call: Callable[[], int], min_time_s: float, warmup: int = 5) -> float:
    """Items per second of ``call`` (which returns how many items it processed): items / median call time.

    Warm-up for ``warmup`` calls and min_time_s / 2, then calls repeat for at least min_time_s (and at least
    5 times). The median, not the mean, because on a
    shared machine a few calls land in another process's burst; and PyTorch eager runs the first calls of a
    new shape 10-100x slower, which the warm-up calls absorb.
    """
    warm_until = time.perf_counter() + min_time_s / 2
    for done in itertools.count():
        if done >= warmup and time.perf_counter() >= warm_until:
            break
        call()
    times: list[float] = []
    items = 0
    start = time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < min_time_s:
        began = time.perf_counter()
        items = call()
        times.append(time.perf_counter() - began)
    return items / statistics.median(times)


def interleaved(
    variants: Mapping[str, Callable[[], Any]], repetitions: int, desc: str = "measure"
) -> dict[str, list[Any]]:
    """Run each variant once per repetition, rotating the order every repetition; their results per name.

    Rotation keeps a variant from always running right after the same neighbour (caches, turbo, other
    agents' bursts), which would bias a ratio measured side by side.
    """
    names = list(variants)
    results: dict[str, list[Any]] = {name: [] for name in names}
    with tqdm(total=repetitions * len(names), desc=desc, unit="run", dynamic_ncols=True, leave=False) as bar:
        for rep in range(repetitions):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                bar.set_postfix_str(name)
                results[name].append(variants[name]())
                bar.update()
    return results


def ratio(numerator: dict[str, float], denominator: dict[str, float]) -> float:
    """Ratio of two medians (the headline figure of a comparison)."""
    return numerator["median"] / denominator["median"]


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import numpy
    import onnxruntime
    import torch

    info: dict[str, Any] = {
        "cpus_usable": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "numpy": numpy.__version__,
        "kernel": platform.release(),
    }
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        lscpu = ""
    wanted = ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)", "L2 cache", "L3 cache")
    for line in lscpu.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in wanted:
            info[key.strip()] = value.strip()
    info["cpu_flags"] = cpu_flags()
    return info


# The ISA extensions that decide which kernels ONNX Runtime, MKL and CTranslate2 pick: machines here differ
# (AVX-512 with VNNI/BF16 on some, AVX2 only on others), so every result records them.
CPU_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_int8",
)  # fmt: skip


def cpu_flags() -> list[str]:
    """Which of CPU_FLAGS this CPU has (from /proc/cpuinfo)."""
    flags: set[str] = set()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        line = next((x for x in cpuinfo if x.startswith("flags")), "")
        flags = set(line.partition(":")[2].split())
    return [f for f in CPU_FLAGS if f in flags]


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Repeated measurements that each report several numbers → one summary per number; a text a run reports (such
    as its first error) is kept as the first run gave it."""
    out: dict[str, Any] = {
        key: summarize([run[key] for run in runs]) for key in runs[0] if isinstance(runs[0][key], int | float)
    }
    for run in runs:
        for key, value in run.items():
            if isinstance(value, str):
                out.setdefault(key, value)
    return out
