"""Every runtime at two thread counts (all usable cores, and one); a comparison takes each side's better one.

On this shared 2-core machine (other jobs keep the load average at 4-8), a runtime with 2 intra-op threads is
often several times slower than with 1: PyTorch eager at batch 8 × 128 tokens took 124-142 ms per forward with
2 OpenMP threads and 24-47 ms with 1, and ONNX Runtime suffers the same way. Each parallel region of a forward
waits at a barrier for a thread the scheduler has parked. Which count wins depends on the load at that moment,
so both are measured, interleaved, and each variant is represented by its faster count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch

from serving.ort_backend.session_config import available_cpus

T = TypeVar("T")
ONE_THREAD_SUFFIX = "_1thread"


def counts() -> dict[str, int]:
    """Name suffix → intra-op threads: "" for all usable cores, "_1thread" for one."""
    return {"": available_cpus(), ONE_THREAD_SUFFIX: 1}


def with_threads(fn: Callable[..., T], threads: int | None) -> Callable[..., T]:
    """``fn`` run with ``threads`` intra-op threads (None: every usable core)."""

    def call(*args: Any) -> T:
        torch.set_num_threads(threads or available_cpus())
        return fn(*args)

    return call


def both_thread_counts(name: str, fn: Callable[..., T]) -> dict[str, Callable[..., T]]:
    """A PyTorch variant at all cores (``name``) and at one thread (``name`` + ``_1thread``)."""
    return {name: with_threads(fn, None), name + ONE_THREAD_SUFFIX: with_threads(fn, 1)}


def best(medians: Mapping[str, float], name: str) -> tuple[str, float]:
    """The faster of the variants ``name`` and ``name_1thread``: (its name, its median)."""
    candidates = [n for n in (name, name + ONE_THREAD_SUFFIX) if n in medians]
    winner = max(candidates, key=lambda n: medians[n])
    return winner, medians[winner]
