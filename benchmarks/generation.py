"""Comparison 2, generation: the PyTorch eager greedy loop vs the one-graph ORT BeamSearch op (greedy, beam 4).

The same test sentences, batch sizes and token budget (the task's served default) for every variant;
sentences/s and generated tokens/s (eos and padding not counted).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from benchmarks import data, threads
from benchmarks.onnx_variants import session
from benchmarks.profiles import CHECKPOINTS, REPOSITORY, Profile
from benchmarks.stats import interleaved, summarize
from export.graphs.seq2seq_export import generate_onnx
from export.model.reference_search import greedy
from export.training import seq2seq
from export.training.data import Pair
from export.training.loop import pad_batch
from serving.ort_backend.session_config import available_cpus
from tasks.definition import get as get_task

TASKS = ("translate", "summarize")
EAGER, OP_GREEDY, OP_BEAM4 = "pytorch_eager_greedy", "ort_beamsearch_greedy", "ort_beamsearch_beam4"
BASE_VARIANTS = (EAGER, OP_GREEDY, OP_BEAM4)

Batch = tuple[torch.Tensor, torch.Tensor]


def source_pairs(task: str, profile: Profile, count: int) -> tuple[list[Pair], str]:
    """The first ``count`` test pairs of the task, in test-file order, and where they came from; without the
    task's data, built-in source texts (no reference: generation speed needs none)."""
    if data.available(profile.data_dir, task):
        return seq2seq.TASKS[task].reader(profile.data_dir)[1][:count], "test split"
    return [Pair(text, "") for text in data.fallback_texts(task, count)], data.BUILT_IN


def test_batches(
    task: str, profile: Profile, batch_size: int, src_tokenizer: Any, tgt_tokenizer: Any
) -> tuple[list[Batch], str]:
    """``generation_sentences`` test sentences of the task cut into padded batches, and their source."""
    count = max(batch_size, profile.generation_sentences // batch_size * batch_size)
    pairs, source = source_pairs(task, profile, count)
    sources = [src for src, _ in seq2seq.encode_pairs(pairs, src_tokenizer, tgt_tokenizer, seq2seq.TASKS[task])]
    return [pad_batch(sources[i : i + batch_size]) for i in range(0, len(sources), batch_size)], source


def timed_pass(generate: Callable[[torch.Tensor, torch.Tensor], list[list[int]]], batches: list[Batch]) -> dict:
    """Generate for every batch once: sentences/s and generated tokens/s of the whole pass."""
    sentences = tokens = 0
    start = time.perf_counter()
    for ids, mask in batches:
        outputs = generate(ids, mask)
        sentences += len(outputs)
        tokens += sum(len(out) for out in outputs)
    elapsed = time.perf_counter() - start
    return {"sentences_per_s": sentences / elapsed, "tokens_per_s": tokens / elapsed, "tokens": tokens}


def _generate_onnx(sess: Any, new_tokens: int, beams: int, cfg: Any, ids: torch.Tensor, mask: torch.Tensor):
    return generate_onnx(sess, ids.numpy(), mask.numpy(), new_tokens, beams, cfg)


def measure_task(task: str, profile: Profile) -> list[dict[str, Any]]:
    model, _, src_tok, tgt_tok = seq2seq.load(CHECKPOINTS / task)
    model.eval()
    new_tokens = profile.generation_new_tokens or get_task(task).option("max_new_tokens").default
    variants: dict[str, Callable[[torch.Tensor, torch.Tensor], list[list[int]]]] = {
        **threads.both_thread_counts(EAGER, lambda ids, mask: greedy(model, ids, mask, new_tokens)),
    }
    for suffix, count in threads.counts().items():
        sess = session(REPOSITORY / f"{task}_generator" / "1" / "model.onnx", count)
        for name, beams in ((OP_GREEDY, 1), (OP_BEAM4, 4)):
            variants[name + suffix] = partial(_generate_onnx, sess, new_tokens, beams, model.cfg)
    rows = []
    for batch_size in profile.generation_batches:
        batches, source = test_batches(task, profile, batch_size, src_tok, tgt_tok)
        for generate in variants.values():  # warm-up: first-call allocations, thread pools
            generate(*batches[0])
        runs = interleaved(
            {name: partial(timed_pass, generate, batches) for name, generate in variants.items()},
            profile.repetitions,
            desc=f"{task} b{batch_size}",
        )
        rows.append(
            {
                "task": task,
                "batch": batch_size,
                "max_new_tokens": new_tokens,
                "sentences": sum(len(ids) for ids, _ in batches),
                "texts": source,
                "sentences_per_s": {name: summarize([r["sentences_per_s"] for r in rs]) for name, rs in runs.items()},
                "tokens_per_s": {name: summarize([r["tokens_per_s"] for r in rs]) for name, rs in runs.items()},
                "generated_tokens": {name: rs[0]["tokens"] for name, rs in runs.items()},
            }
        )
    return rows


def measure(profile: Profile) -> dict[str, Any]:
    torch.set_num_threads(available_cpus())
    with torch.inference_mode():
        rows = [row for task in TASKS for row in measure_task(task, profile)]
    return {"threads": threads.counts(), "rows": rows}
