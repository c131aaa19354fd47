"""Comparison 5, the ceiling: this machine's fp32 matrix-multiply rate and the model's FLOPs per sequence.

With both, a throughput becomes a fraction of what the cores could do at best, which says how much is left
to gain by any runtime (int8 does not do fp32 FLOPs; its fraction is "fp32-equivalent" work).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.profiles import CHECKPOINTS, Profile
from benchmarks.stats import summarize
from export import sentiment
from serving.ort_backend.session_config import available_cpus

MATMUL_SIZE = 1024


def matmul_gflops(min_time_s: float, size: int = MATMUL_SIZE) -> float:
    """fp32 GFLOP/s of a square matmul (2·n³ FLOPs each) with all usable cores, run for at least min_time_s."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.matmul(a, b)
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < min_time_s or count < 3:
        torch.matmul(a, b)
        count += 1
    return 2 * size**3 * count / elapsed / 1e9


def flops_per_sequence(sequence: int) -> int:
    """FLOPs of one forward of the sentiment classifier at this length (PyTorch's FLOP counter: matmuls and
    attention; norms, activations and softmax are a few percent and not counted)."""
    model, _, _ = sentiment.load(CHECKPOINTS / "sentiment")
    ids = torch.randint(4, model.cfg.vocab_size, (1, sequence))
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model.eval()(ids, torch.ones_like(ids))
    return int(counter.get_total_flops())


def measure(profile: Profile) -> dict[str, Any]:
    torch.set_num_threads(available_cpus())
    rates = [matmul_gflops(max(0.2, profile.min_time_s)) for _ in range(max(5, profile.repetitions))]
    return {
        "threads": available_cpus(),
        "matmul_size": MATMUL_SIZE,
        "matmul_gflops": summarize(rates),
        "flops_per_sequence": {str(seq): flops_per_sequence(seq) for seq in profile.sequences},
    }


def fractions(ceiling: dict[str, Any], runtime_results: dict[str, Any]) -> list[dict[str, Any]]:
    """For each sequence length at the largest batch: the fastest variant and its share of the matmul ceiling.

    FLOPs are the fp32 model's; int8 does the same work in integer ops, so its share is "fp32-equivalent"
    and may exceed 100%.
    """
    peak = ceiling["matmul_gflops"]["max"] * 1e9  # the ceiling is the best the cores did, not a typical run
    largest = max(shape["batch"] for shape in runtime_results["shapes"])
    out = []
    for shape in runtime_results["shapes"]:
        if shape["batch"] != largest or str(shape["sequence"]) not in ceiling["flops_per_sequence"]:
            continue
        best, summary = max(shape["sequences_per_s"].items(), key=lambda item: item[1]["median"])
        flops = ceiling["flops_per_sequence"][str(shape["sequence"])]
        achieved = summary["median"] * flops
        out.append(
            {
                "batch": largest,
                "sequence": shape["sequence"],
                "best_variant": best,
                "sequences_per_s": summary["median"],
                "achieved_gflops": achieved / 1e9,
                "fraction_of_ceiling": achieved / peak,
            }
        )
    return out
