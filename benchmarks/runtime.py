"""Comparison 1, model runtime: PyTorch eager vs ORT decomposed vs ORT fused vs ORT int8, sentiment encoder.

Throughput (sequences/s) at every batch × sequence length, on the same random token ids for every variant,
and the accuracy of every variant on the sentiment test split (the project's split and evaluation code).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from benchmarks import data, threads
from benchmarks.onnx_variants import OrtClassifier, export_decomposed, quantize_int8, session
from benchmarks.profiles import CHECKPOINTS, REPOSITORY, Profile
from benchmarks.stats import interleaved, rate, summarize
from export.graphs.onnx_export import count_ops
from export.training import sentiment
from export.training.data import sentiment_splits
from serving.ort_backend.session_config import available_cpus

EAGER, DECOMPOSED, FUSED, INT8 = "pytorch_eager", "ort_decomposed", "ort_fused", "ort_int8"
EAGER_1T = EAGER + threads.ONE_THREAD_SUFFIX


def prepare_files(workdir: Path) -> tuple[dict[str, str], list[str]]:
    """Export the decomposed variant and quantize the fused one: (name → ONNX path, RoPE nodes excluded)."""
    fused = REPOSITORY / "sentiment_encoder" / "1" / "model.onnx"
    if not fused.is_file():
        raise FileNotFoundError(f"{fused} is missing: run `make repository` first")
    model, _, _ = sentiment.load(CHECKPOINTS / "sentiment")
    decomposed = export_decomposed(model, workdir / "sentiment_decomposed.onnx")
    int8 = workdir / "sentiment_fused_int8.onnx"
    excluded = quantize_int8(fused, int8)
    return {DECOMPOSED: str(decomposed), FUSED: str(fused), INT8: str(int8)}, excluded


def build_variants(model: nn.Module, workdir: Path) -> tuple[dict[str, nn.Module], dict[str, Any]]:
    """name → callable classifier module, and what each variant is (file, op counts, quantization).

    The export runs in a child process: after ``torch.onnx.export`` the exporting process runs its next few
    dozen eager forwards ~50× slower (measured: 290 ms instead of 6 ms at batch 1), which would bias eager.
    """
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        files, excluded = pool.apply(prepare_files, (workdir,))
    modules: dict[str, nn.Module] = {EAGER: model}  # the eager thread count is set per call (threads.with_threads)
    for name, path in files.items():
        for suffix, count in threads.counts().items():
            modules[name + suffix] = OrtClassifier(session(Path(path), count))
    info: dict[str, Any] = {name: {"file": path, "ops": count_ops(Path(path))} for name, path in files.items()}
    info[EAGER] = {"file": str(CHECKPOINTS / "sentiment")}
    info[INT8]["excluded_from_quantization"] = excluded
    info[INT8]["quantized_op_types"] = ["MatMul"]
    return modules, info


def throughput_calls(
    modules: dict[str, nn.Module], ids: torch.Tensor, mask: torch.Tensor
) -> dict[str, Callable[[], int]]:
    """One call per variant that runs a forward and returns its batch size; every variant at both thread
    counts (ORT sessions are built per count, eager sets its count per call)."""

    def forward(module: nn.Module) -> int:
        with torch.inference_mode():
            module(ids, mask)
        return ids.shape[0]

    calls: dict[str, Callable[[], int]] = {}
    for name, module in modules.items():
        if name == EAGER:
            calls |= {n: partial(fn, module) for n, fn in threads.both_thread_counts(EAGER, forward).items()}
        else:
            calls[name] = partial(forward, module)
    return calls


def accuracy(modules: dict[str, nn.Module], tokenizer: Any, max_tokens: int, profile: Profile) -> dict[str, Any]:
    """Test-split accuracy of every variant, with the evaluation code that produced the checkpoint metrics;
    without the sentiment data, only the reason it was not measured."""
    if not data.available(profile.data_dir, "sentiment"):
        return {"not_measured": f"no data at {data.where(profile.data_dir, 'sentiment')}"}
    test_rows = sentiment_splits(profile.data_dir)[2]
    if profile.accuracy_limit:
        test_rows = test_rows[: profile.accuracy_limit]
    ids = sentiment.encode(tokenizer, [r.text for r in test_rows], max_tokens)
    scores = {}
    for name, module in modules.items():
        if name.endswith(threads.ONE_THREAD_SUFFIX):
            continue  # the same model with another thread count
        metrics = sentiment.classification_metrics(test_rows, sentiment.predict(module, ids))
        scores[name] = metrics["all"]["accuracy"]
    return {**scores, "n": len(test_rows)}


def measure(profile: Profile, workdir: Path) -> dict[str, Any]:
    torch.set_num_threads(available_cpus())
    model, config, tokenizer = sentiment.load(CHECKPOINTS / "sentiment")
    model.eval()
    modules, info = build_variants(model, workdir)
    rng = np.random.default_rng(0)
    shapes = []
    for seq in profile.sequences:
        for batch in profile.batches:
            ids = torch.from_numpy(rng.integers(4, model.cfg.vocab_size, (batch, seq), dtype=np.int64))
            mask = torch.ones_like(ids)
            calls = throughput_calls(modules, ids, mask)
            runs = interleaved(
                {name: (lambda c=call: rate(c, profile.min_time_s)) for name, call in calls.items()},
                profile.repetitions,
                desc=f"runtime b{batch} s{seq}",
            )
            shapes.append(
                {"batch": batch, "sequence": seq, "sequences_per_s": {k: summarize(v) for k, v in runs.items()}}
            )
    return {
        "threads": threads.counts(),
        "model": config["model"],
        "variants": info,
        "shapes": shapes,
        "accuracy": accuracy(modules, tokenizer, config["max_tokens"], profile),
    }
