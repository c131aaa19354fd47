"""One runtime's greedy generation over the same prompt ids, timed in a process of its own (benchmarks/llm.py
spawns one per runtime and precision), so that its resident memory is that runtime's alone.

Every runtime is asked for the same thing: `prompts` (lists of token ids: the task's instruction around a test
sentence, in the chat template), NEW_TOKENS greedy tokens each, `batch` prompts at a time: ours through the
engine with at most `batch` running rows (continuous batching), CTranslate2's `Generator.generate_batch` with
`max_batch_size`, ONNX Runtime GenAI's `Generator` over left-padded batches. Tokens/s counts the tokens each
returned (up to its end token); time to first token is timed at batch 1, one prompt at a time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def timed(passes: list[list[list[int]]], run: Callable[[list[list[int]]], int]) -> dict[str, Any]:
    """`run` over the first pass (warm-up: its prompts are not measured), then each other; tokens/s per pass."""
    run(passes[0])
    rates = []
    for prompts in passes[1:]:
        started = time.perf_counter()
        tokens = run(prompts)
        rates.append(tokens / (time.perf_counter() - started))
    return {"tokens_per_s": statistics.median(rates), "runs": rates}


def rss_mb() -> float:
    import psutil

    return round(psutil.Process().memory_info().rss / 2**20, 1)


def ours(checkpoint: str, precision: str, passes: list, batch: int, new_tokens: int, cache_mib: int) -> dict:
    from pathlib import Path

    from serving.engine.engine import Engine, Job
    from tasks.definition import EngineSettings

    settings = EngineSettings(max_rows=batch, prefix_cache_mib=cache_mib)
    engine = Engine.load(Path(checkpoint), precision, threads=2, settings=settings)

    def run(prompts: list[list[int]]) -> int:
        answers: list[list[int]] = [[] for _ in prompts]
        for prompt, answer in zip(prompts, answers):
            engine.submit(Job(prompt, new_tokens, 1, lambda tokens, finish, answer=answer: answer.extend(tokens)))
        engine.run_until_idle()
        return sum(map(len, answers))

    result = timed(passes, run)
    if batch == 1:
        engine.stats.drain()
        for prompt in passes[-1]:
            run([prompt])
        result["ttft_ms"] = statistics.median(engine.stats.drain()[1]) * 1000
    return result | {"rss_mb": rss_mb()}


def ctranslate2(model: str, tokens: dict[int, str], passes: list, batch: int, new_tokens: int) -> dict:
    import ctranslate2 as ct2

    generator = ct2.Generator(model, device="cpu", inter_threads=1, intra_threads=2)
    options = {"max_length": new_tokens, "sampling_topk": 1, "include_prompt_in_result": False}

    def pieces(prompt: list[int]) -> list[str]:
        return [tokens[i] for i in prompt]

    def run(prompts: list[list[int]]) -> int:
        results = generator.generate_batch([pieces(p) for p in prompts], max_batch_size=batch, **options)
        return sum(len(r.sequences_ids[0]) for r in results)

    result = timed(passes, run)
    if batch == 1:
        firsts = []
        for prompt in passes[-1]:
            started = time.perf_counter()
            next(iter(generator.generate_tokens(pieces(prompt), max_length=new_tokens, sampling_topk=1)))
            firsts.append(time.perf_counter() - started)
        result["ttft_ms"] = statistics.median(firsts) * 1000
    return result | {"rss_mb": rss_mb()}


def genai(model: str, passes: list, batch: int, new_tokens: int) -> dict:
    import json
    from pathlib import Path

    import numpy as np
    import onnxruntime_genai as og

    loaded = og.Model(model)
    config = json.loads((Path(model) / "genai_config.json").read_text())["model"]
    pad_id, eos = config["pad_token_id"], config["eos_token_id"]
    eos_ids = eos if isinstance(eos, list) else [eos]

    def generator(prompts: list[list[int]]) -> tuple[Any, int]:
        width = max(map(len, prompts))
        ids = np.full((len(prompts), width), pad_id, np.int32)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = prompt  # GenAI's batches are left-padded
        params = og.GeneratorParams(loaded)
        params.set_search_options(max_length=width + new_tokens, do_sample=False, batch_size=len(prompts))
        made = og.Generator(loaded, params)
        made.append_tokens(ids)
        return made, width

    def run(prompts: list[list[int]]) -> int:
        count = 0
        for start in range(0, len(prompts), batch):
            made, width = generator(prompts[start : start + batch])
            while not made.is_done():
                made.generate_next_token()
            for row in range(len(prompts[start : start + batch])):
                answer = list(made.get_sequence(row))[width:]
                ends = [i for i, t in enumerate(answer) if t in eos_ids]
                count += ends[0] if ends else len(answer)
        return count

    result = timed(passes, run)
    if batch == 1:
        firsts = []
        for prompt in passes[-1]:
            started = time.perf_counter()
            made, _ = generator([prompt])  # append_tokens reads the prompt
            made.generate_next_token()
            firsts.append(time.perf_counter() - started)
        result["ttft_ms"] = statistics.median(firsts) * 1000
    return result | {"rss_mb": rss_mb()}
