"""Comparison 5, the ceiling: this machine's fp32 matrix-multiply rate and the model's FLOPs per sequence.

With both, a throughput becomes a fraction of what the cores could do at best, which says how much is left
to gain by any runtime (int8 does not do fp32 FLOPs; its fraction is "fp32-equivalent" work).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.profiles import CHECKPOINTS, Profile
from benchmarks.stats import interleaved, summarize
from export.training import sentiment
from serving.ort_backend.session_config import available_cpus

MATMUL_SIZE = 1024
LIBRARIES = ("torch", "numpy")


def matmul_gflops(min_time_s: float, library: str = "torch", size: int = MATMUL_SIZE) -> float:
    """fp32 GFLOP/s of a square matmul (2·n³ FLOPs each) with all usable cores, run for at least min_time_s.

    ``library``: "torch" (MKL) or "numpy" (OpenBLAS); the ceiling is the better of the two, since either
    BLAS may pick a slower code path on a given CPU.
    """
    rng = np.random.default_rng(0)
    a, b = rng.random((size, size), dtype=np.float32), rng.random((size, size), dtype=np.float32)
    if library == "torch":
        a, b = torch.from_numpy(a), torch.from_numpy(b)
    a @ b
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < min_time_s or count < 3:
        a @ b
        count += 1
    return 2 * size**3 * count / elapsed / 1e9


def matmul_runs(profile: Profile) -> dict[str, list[float]]:
    """Repeated matmul rates per library, interleaved. Called at the start and again at the end of a run:
    the other jobs on a shared machine come and go, and the ceiling is the best the cores did."""
    torch.set_num_threads(available_cpus())
    runs = interleaved(
        {lib: partial(matmul_gflops, max(0.2, profile.min_time_s), lib) for lib in LIBRARIES},
        max(3, profile.repetitions),
        desc="matmul",
    )
    return runs


def flops_per_sequence(sequence: int) -> int:
    """FLOPs of one forward of the sentiment classifier at this length (PyTorch's FLOP counter: matmuls and
    attention; norms, activations and softmax are a few percent and not counted)."""
    model, _, _ = sentiment.load(CHECKPOINTS / "sentiment")
    ids = torch.randint(4, model.cfg.vocab_size, (1, sequence))
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model.eval()(ids, torch.ones_like(ids))
    return int(counter.get_total_flops())


def measure(profile: Profile) -> dict[str, Any]:
    return {
        "threads": available_cpus(),
        "matmul_size": MATMUL_SIZE,
        "matmul_runs_start": matmul_runs(profile),
        "flops_per_sequence": {str(seq): flops_per_sequence(seq) for seq in profile.sequences},
    }


def finish(ceiling: dict[str, Any], profile: Profile, runtime_results: dict[str, Any] | None) -> None:
    """At the end of the run: measure the matmul rate again, set the ceiling to the best of all runs, and the
    fraction of it that the runtime variants reached."""
    ceiling["matmul_runs_end"] = matmul_runs(profile)
    every = [v for key in ("matmul_runs_start", "matmul_runs_end") for runs in ceiling[key].values() for v in runs]
    ceiling["matmul_gflops"] = summarize(every)
    if runtime_results:
        ceiling["fractions"] = fractions(ceiling, runtime_results)


def fractions(ceiling: dict[str, Any], runtime_results: dict[str, Any]) -> list[dict[str, Any]]:
    """For each sequence length at the largest batch: the fastest fp32 variant and the fastest of all, with their
    share of the matmul ceiling.

    FLOPs are the fp32 model's; int8 does the same work in integer ops, so its share is "fp32-equivalent"
    and may exceed 100%.
    """
    peak = ceiling["matmul_gflops"]["max"] * 1e9  # the ceiling is the best the cores did, not a typical run
    largest = max(shape["batch"] for shape in runtime_results["shapes"])
    out = []
    for shape in runtime_results["shapes"]:
        if shape["batch"] != largest or str(shape["sequence"]) not in ceiling["flops_per_sequence"]:
            continue
        flops = ceiling["flops_per_sequence"][str(shape["sequence"])]
        rates = shape["sequences_per_s"]
        fp32 = {name: s for name, s in rates.items() if "int8" not in name}
        for kind, pool in (("fp32", fp32), ("any", rates)):
            best, summary = max(pool.items(), key=lambda item: item[1]["median"])
            achieved = summary["median"] * flops
            out.append(
                {
                    "batch": largest,
                    "sequence": shape["sequence"],
                    "kind": kind,
                    "best_variant": best,
                    "sequences_per_s": summary["median"],
                    "achieved_gflops": achieved / 1e9,
                    "fraction_of_ceiling": achieved / peak,
                }
            )
    return out
