"""A decoder-only model's prompts read a chunk per step beside running rows, their shared prefixes reused from the
prefix cache (serving/engine/prefill.py, prefix_cache.py), against transformers' own `generate`: the answers are
the same whatever the chunk, the cache and the company a prompt keeps.

The model is a small random Qwen2 built with transformers' classes (weights drawn wide so that choices are not
ties), its step graph exported by the importer's own exporter; the trained folders and the served path are
tests/test_import_causal_lm.py's.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from serving.engine.prefix_cache import PrefixCache
from tasks.definition import EngineSettings

VOCAB, EOS = 300, 1
INSTRUCTION = list(range(100, 150))  # a task's instruction: 50 tokens every prompt starts with


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(the transformers model, the folder holding its decoder.onnx and config.json)."""
    import onnx
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from export.import_hf import causal_lm

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rope_theta=1e6, tie_word_embeddings=True,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    for parameter in model.parameters():
        parameter.data.normal_(0, 0.3)
    settings = causal_lm.read_settings(config, GenerationConfig(eos_token_id=EOS))
    folder = tmp_path_factory.mktemp("tiny_causal")
    with torch.no_grad():
        onnx.save(causal_lm.export_step(model, settings), str(folder / "decoder.onnx"))
    generation = {"decoder_start_id": EOS, "eos_id": EOS, "early_stopping": False}
    (folder / "config.json").write_text(json.dumps({"decoder_only": True, "generation": generation}))
    return model, folder


def generate(model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    import torch

    answers = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, num_beams=1,
                eos_token_id=EOS, pad_token_id=EOS,
            )  # fmt: skip
            answers.append([t for t in out[0, len(prompt) :].tolist() if t != EOS])
    return answers


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    """Prompts of 1 to 200 tokens; most start with INSTRUCTION, as a task's prompts do."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        text = [rng.randrange(2, VOCAB) for _ in range(rng.randrange(1, 150))]
        out.append(INSTRUCTION + text if i % 4 else text)
    return out


def engine(folder: Path, **settings):
    from serving.engine.engine import Engine

    return Engine.load(folder, threads=2, settings=EngineSettings(**settings))


def run(engine, prompts: list[list[int]], new_tokens: int, log: list | None = None) -> list[list[int]]:
    from serving.engine.engine import Job

    answers: list[list[int]] = [[] for _ in prompts]

    def on_tokens(row: int):
        def take(tokens: list[int], finish) -> None:
            answers[row].extend(tokens)
            if log is not None and tokens:
                log.append((row, engine.stats.steps))

        return take

    for row, prompt in enumerate(prompts):
        engine.submit(Job(prompt, new_tokens, 1, on_tokens(row)))
    engine.run_until_idle()
    return answers


@pytest.mark.export
@pytest.mark.parametrize("chunk, cache_mib", [(16, 0), (16, 64), (4096, 64), (7, 1)])
def test_answers_are_generates_whatever_the_chunk_and_the_cache(tiny, chunk, cache_mib):
    """40 prompts in two waves (the second finds the first's prefixes), read in chunks of 16 (or whole, or 7:
    pieces that cross cache blocks), with the prefix cache off, on, and too small to hold much: every answer is
    generate's."""
    model, folder = tiny
    batch = prompts(40)
    served = engine(folder, prefill_chunk_tokens=chunk, prefix_cache_mib=cache_mib)
    ours = run(served, batch[:10], 12) + run(served, batch[10:], 12)
    theirs = generate(model, batch, 12)
    assert len({tuple(answer) for answer in theirs}) > 20  # prompts get answers of their own
    assert ours == theirs
    if cache_mib:
        assert served.stats.cached_prompt_tokens > 0


@pytest.mark.export
def test_a_shared_prefix_is_read_once_and_reused_and_its_hits_counted(tiny):
    """One prompt with the instruction warms the cache; the next 10 find its 48 whole-block tokens (50 tokens,
    blocks of 16) and compute only the rest; their answers are generate's."""
    model, folder = tiny
    served = engine(folder)
    first, *rest = [INSTRUCTION + [7 + i, 8, 9] for i in range(11)]
    run(served, [first], 4)
    assert (served.stats.prompt_tokens, served.stats.cached_prompt_tokens) == (len(first) - 1, 0)
    assert run(served, rest, 8) == generate(model, rest, 8)
    assert served.stats.cached_prompt_tokens == 10 * 48
    assert served.stats.prompt_tokens == 11 * (len(first) - 1)


@pytest.mark.export
def test_a_long_prompt_is_read_over_several_steps_while_running_rows_keep_decoding(tiny):
    """A 400-token prompt with a chunk of 32 takes 12 steps to read; a short prompt submitted with it gets a token
    at every one of those steps, and the long prompt's first token comes after them. Without chunking (a chunk
    as long as the prompt) the long prompt is read in the step it joins."""
    model, folder = tiny
    rng = random.Random(1)
    long = [rng.randrange(2, VOCAB) for _ in range(400)]
    short = [5, 6, 7]
    log: list = []
    served = engine(folder, prefill_chunk_tokens=32, prefix_cache_mib=0)
    answers = run(served, [short, long], 40, log)
    assert answers == generate(model, [short, long], 40)
    first_long = next(step for row, step in log if row == 1)
    short_steps = {step for row, step in log if row == 0}
    assert first_long >= 400 // 32  # each step read 32 of its tokens
    assert set(range(1, first_long)) <= short_steps  # the short one was answered at each of those steps

    log = []
    whole = engine(folder, prefill_chunk_tokens=4096, prefix_cache_mib=0)
    run(whole, [short, long], 40, log)
    assert next(step for row, step in log if row == 1) == 1


@pytest.mark.export
def test_beam_search_continues_a_read_prompt_in_every_beam(tiny):
    """A prompt read in chunks is copied into each of its beams' rows: beam 4 answers are generate's."""
    import torch

    model, folder = tiny
    batch = prompts(6, seed=3)
    served = engine(folder, prefill_chunk_tokens=16)
    from serving.engine.engine import Job

    answers: list[list[int]] = [[] for _ in batch]
    for row, prompt in enumerate(batch):
        served.submit(Job(prompt, 10, 4, lambda tokens, finish, row=row: answers[row].extend(tokens)))
    served.run_until_idle()
    with torch.no_grad():
        for prompt, answer in zip(batch, answers):
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=10, num_beams=4, do_sample=False, early_stopping=False,
                eos_token_id=EOS, pad_token_id=EOS, length_penalty=1.0,
            )  # fmt: skip
            assert answer == [t for t in out[0, len(prompt) :].tolist() if t != EOS]


@pytest.mark.export
def test_a_prompt_cancelled_while_it_is_read_answers_cancelled_and_frees_its_place(tiny):
    from serving.engine.engine import Job
    from serving.engine.search import Finish

    _, folder = tiny
    served = engine(folder, prefill_chunk_tokens=16, prefix_cache_mib=0)
    finishes: list = []
    job = Job(list(range(2, 200)), 10, 1, lambda tokens, finish: finishes.append(finish))
    served.submit(job)
    served.iterate()  # admitted, 16 of its 197 tokens read
    assert served.prefill is not None and served.prefill.jobs == [job] and served.queued_rows() == 1
    served.cancel([job])
    served.iterate()
    assert finishes == [Finish.CANCELLED] and not served.busy() and served.queued_rows() == 0


def blocks(layers: int = 2, columns: int = 64) -> list[np.ndarray]:
    """Caches of one row whose every column holds its own index (so a copied block shows where it came from)."""
    cache = np.broadcast_to(np.arange(columns, dtype=np.float32)[None, None, :, None], (1, 2, columns, 4))
    return [cache.copy() for _ in range(2 * layers)]


def test_the_prefix_cache_finds_only_whole_blocks_of_the_same_tokens_from_the_start():
    cache = PrefixCache(1 << 20, block_tokens=16)
    tokens = list(range(40))
    cache.store(tokens, blocks())
    into = [np.zeros((1, 2, 64, 4), np.float32) for _ in range(4)]
    assert cache.lookup(tokens[:39], into) == 32  # two whole blocks
    assert into[3][0, 1, :32, 2].tolist() == list(range(32)) and not into[3][0, :, 32:].any()
    assert cache.lookup([99] + tokens[1:], into) == 0  # one token differs at the start: nothing is the same
    assert cache.lookup(tokens[:20] + [99] * 20, into) == 16
    assert (cache.queried_tokens, cache.hit_tokens) == (39 + 40 + 40, 48)


def test_the_prefix_cache_stays_within_its_bound_and_drops_a_chains_tail_first():
    """Without the bound it would hold every block stored; with it, the blocks that stay are the heads of the
    chains (what more prompts share), and the bytes never pass the bound."""
    block_bytes = 4 * 2 * 16 * 4 * 4  # caches x heads x block x head_dim x float32
    cache = PrefixCache(5 * block_bytes, block_tokens=16)
    shared = list(range(32))
    for tail in range(6):
        cache.store(shared + [100 + tail] * 32, blocks())  # 4 blocks each, the first 2 shared
        assert cache.bytes <= cache.max_bytes
    into = [np.zeros((1, 2, 64, 4), np.float32) for _ in range(4)]
    assert cache.lookup(shared + [105] * 32, into) == 64  # the last prompt's chain, whole
    assert cache.lookup(shared + [100] * 32, into) == 32  # the first one's tail went, its shared head stayed


@pytest.mark.export
def test_the_int8_twin_loads_and_reads_prompts_in_chunks_as_fp32_does(tiny, tmp_path):
    """The importer's int8 quantization of the step graph (export/import_hf/translation.py's `quantize`) loads,
    reads prompts in chunks, and mostly picks fp32's first token (its weights are int8, its answers close)."""
    import shutil

    from export.import_hf.translation import quantize
    from serving.engine.engine import Engine

    _, folder = tiny
    for file in ("decoder.onnx", "config.json"):
        shutil.copy(folder / file, tmp_path / file)
    quantize(tmp_path, ("decoder.onnx",))
    batch = prompts(20, seed=5)
    settings = EngineSettings(prefill_chunk_tokens=16)
    fp32 = run(Engine.load(tmp_path, "fp32", 2, settings), batch, 4)
    int8 = run(Engine.load(tmp_path, "int8", 2, settings), batch, 4)
    assert all(len(answer) == 4 for answer in int8)
    assert sum(a[0] == b[0] for a, b in zip(fp32, int8)) >= 14
