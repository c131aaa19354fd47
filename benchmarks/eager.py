"""PyTorch eager baselines at two thread counts; the comparisons divide by the faster of the two.

On this shared 2-core machine, eager with 2 OpenMP threads is often 3-5× slower than with 1 (measured
with the load average at 4: batch 8 × 128 tokens 124-142 ms vs 24-47 ms per forward): each of the many
parallel regions of a forward waits at a barrier for a thread the scheduler has parked. Giving the baseline
its better thread count keeps the speed-ups conservative.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch

from serving.ort_backend.session_config import available_cpus

T = TypeVar("T")
ONE_THREAD_SUFFIX = "_1thread"


def with_threads(fn: Callable[..., T], threads: int | None) -> Callable[..., T]:
    """``fn`` run with ``threads`` intra-op threads (None: every usable core)."""

    def call(*args: Any) -> T:
        torch.set_num_threads(threads or available_cpus())
        return fn(*args)

    return call


def both_thread_counts(name: str, fn: Callable[..., T]) -> dict[str, Callable[..., T]]:
    """The eager variant at all cores (``name``) and at one thread (``name`` + ``_1thread``)."""
    return {name: with_threads(fn, None), name + ONE_THREAD_SUFFIX: with_threads(fn, 1)}


def best(medians: Mapping[str, float], name: str) -> tuple[str, float]:
    """The faster of the two eager variants called ``name`` and ``name_1thread``: (its name, its median)."""
    candidates = [n for n in (name, name + ONE_THREAD_SUFFIX) if n in medians]
    winner = max(candidates, key=lambda n: medians[n])
    return winner, medians[winner]
