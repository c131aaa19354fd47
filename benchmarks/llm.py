"""`llm`: a decoder-only model of Qwen2.5-0.5B-Instruct's shape (24 layers, hidden 896, 14 heads, 2 key/value
heads, 151,936 embedding rows, tied; export/import_hf/sample_folders.py builds it with wide random weights, no hub
here) through our engine after `python -m export.import_hf --task translate`, against CTranslate2 (its own
converter, `TransformersConverter`) and ONNX Runtime GenAI (its own model builder, `onnxruntime_genai.models.
builder`), each in fp32 and int8, each in a process of its own (benchmarks/llm_worker.py).

The same prompt ids go to every runtime: the task's instruction around a Tatoeba test sentence in the chat
template, NEW_TOKENS greedy tokens each, at batch 1 (one prompt at a time: tokens/s and time to first token) and
batch 16 (16 rows at once: ours continuous batching with max_rows 16, CTranslate2's max_batch_size, GenAI's
left-padded batches). Ours runs with its prefix cache (the prompts share the template's opening and the
instruction) and without. Each pass reads prompts no earlier pass read, so a cache hit is a shared prefix, not a
repeated prompt.

Served: the real Triton server with the import in fp32 and in int8 (one engine of two threads each, its prefix
cache on), closed-loop gRPC clients (benchmarks/closed_loop.py) sending the same test sentences at 1 and 16
clients, and streams at 1 client for the time to first token. Served tokens/s is answers/s × NEW_TOKENS: the
sample's random weights rarely end an answer early (the offline rows count every token and show it). The bar:
served fp32 at 16 clients ≥ 1.0× CTranslate2's and GenAI's fp32 at batch 16.

    python -m benchmarks --sections llm --name llm   # → benchmarks/results/llm.json, .md
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.profiles import ROOT, Profile
from benchmarks.translation import cpu_info

SAMPLES = ROOT / ".cache" / "hf-samples"  # the built folder is kept: building it costs minutes
NAME = "llm_bench"
PRECISIONS = {"fp32": NAME, "int8": f"{NAME}_int8"}  # the int8 import holds both graphs: offline reads it
CLIENTS = (1, 16)
SERVED_WINDOW_S = 30.0  # an answer takes seconds at 1 client: a window of several
NEW_TOKENS = 32
BATCHES = (1, 16)
PROMPTS = {1: 3, 16: 32}  # prompts per pass at each batch
BAR = 1.0


def sample_folder(profile: Profile, workdir: Path, pairs: list[tuple[str, str]]) -> tuple[Path, str]:
    from export.import_hf.sample_folders import QWEN25_05B, TINY_QWEN2, build_causal_lm

    if profile.name == "smoke":
        # untrained with wide random weights, as QWEN25_05B: it rarely ends an answer early, so every runtime works
        tiny = replace(TINY_QWEN2, train_steps=0, init_std=0.05)
        return build_causal_lm(workdir / "tiny", "qwen2", tiny, pairs), "tiny"
    folder = SAMPLES / "qwen25_05b"
    if not (folder / "model.safetensors").is_file():
        build_causal_lm(folder, "qwen2", QWEN25_05B, pairs)
    return folder, "Qwen2.5-0.5B-shaped"


def prepare(folder: Path, workdir: Path) -> dict[str, Path]:
    """Each runtime's model, converted by its own tool: ours imported twice into one repository (fp32; int8, whose
    folder holds both graphs, which the offline rows read), CTranslate2's and GenAI's per precision."""
    from ctranslate2.converters import TransformersConverter

    from benchmarks.imported import import_both, run_module

    repository, tasks = import_both(folder, workdir, PRECISIONS)
    checkpoints = workdir / "checkpoints"
    models = {"ours": checkpoints / PRECISIONS["int8"], "repository": repository, "tasks": tasks}
    for precision, quantization in (("fp32", None), ("int8", "int8")):
        out = workdir / f"ct2-{precision}"
        TransformersConverter(str(folder)).convert(str(out), quantization=quantization, force=True)
        models[f"ctranslate2 {precision}"] = out
        out = workdir / f"genai-{precision}"
        builder = ("-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o", str(out))
        run_module(*builder, "-p", precision, "-e", "cpu")
        models[f"genai {precision}"] = out
    return models


def prompt_passes(checkpoint: Path, sentences: list[str], batch: int, passes: int) -> list[list[list[int]]]:
    """`passes` lists of prompt ids (the first is the warm-up), each of its own sentences."""
    import json

    from tokenizers import Tokenizer

    from serving.text.chat import ChatPrompt
    from tasks import load

    task = load(checkpoint.parent.parent / "tasks" / f"{checkpoint.name}.toml")
    specials = json.loads((checkpoint / "config.json").read_text())["special_tokens"]
    chat = ChatPrompt((checkpoint / "chat_template.jinja").read_text(), task.prompt.instruction, task.prompt.system,
                      tuple(specials.items()))  # fmt: skip
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    size = PROMPTS[batch]
    texts = [sentences[(i * size + j) % len(sentences)] for i in range(passes) for j in range(size)]
    ids = [tokenizer.encode(chat(text), add_special_tokens=False).ids for text in texts]
    return [ids[i * size : (i + 1) * size] for i in range(passes)]


def _in_own_process(function: str, *args: Any) -> dict[str, Any]:
    from benchmarks import llm_worker

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(getattr(llm_worker, function), *args).result()


def offline(models: dict[str, Path], sentences: list[str], repetitions: int) -> list[dict[str, Any]]:
    from tokenizers import Tokenizer

    checkpoint = models["ours"]
    vocabulary = Tokenizer.from_file(str(checkpoint / "tokenizer.json")).get_vocab()
    pieces = {index: piece for piece, index in vocabulary.items()}
    rows = []
    for batch in BATCHES:
        passes = prompt_passes(checkpoint, sentences, batch, 1 + repetitions)
        cells: dict[str, tuple[str, tuple[Any, ...]]] = {
            "ours fp32": ("ours", (str(checkpoint), "fp32", passes, batch, NEW_TOKENS, 256)),
            "ours fp32, no prefix cache": ("ours", (str(checkpoint), "fp32", passes, batch, NEW_TOKENS, 0)),
            "ours int8": ("ours", (str(checkpoint), "int8", passes, batch, NEW_TOKENS, 256)),
        }
        for precision in ("fp32", "int8"):
            cells[f"ctranslate2 {precision}"] = (
                "ctranslate2",
                (str(models[f"ctranslate2 {precision}"]), pieces, passes, batch, NEW_TOKENS),
            )
            cells[f"genai {precision}"] = ("genai", (str(models[f"genai {precision}"]), passes, batch, NEW_TOKENS))
        for runtime, (function, args) in cells.items():
            print(f"[bench] llm {runtime} batch {batch}", file=sys.stderr, flush=True)
            result = _in_own_process(function, *args)
            rows.append({"runtime": runtime, "batch": batch, "prompt_tokens_p50": _median_length(passes), **result})
    return rows


def _median_length(passes: list[list[list[int]]]) -> float:
    import statistics

    return statistics.median(len(prompt) for prompts in passes for prompt in prompts)


def served(models: dict[str, Path], sentences: list[str], profile: Profile) -> tuple[list[dict], dict[str, Any]]:
    """The closed-loop points, and the server's memory. The SDK's streams look the task up by name: the imports'
    task folder is on ROPESERVE_TASKS_PATH meanwhile."""
    from tasks import PATH_VARIABLE

    saved = os.environ.get(PATH_VARIABLE)
    os.environ[PATH_VARIABLE] = str(models["tasks"])
    try:
        return _served(models["repository"], sentences, profile)
    finally:
        if saved is None:
            os.environ.pop(PATH_VARIABLE)
        else:
            os.environ[PATH_VARIABLE] = saved


def _served(repository: Path, sentences: list[str], profile: Profile) -> tuple[list[dict], dict[str, Any]]:
    from benchmarks.closed_loop import closed_loop, start_server
    from benchmarks.soak import stub_rss_mb
    from benchmarks.stats import summarize_runs
    from serving.launcher.processes import group_rss_mb

    window = SERVED_WINDOW_S if profile.name != "smoke" else profile.translation_seconds
    warmup = profile.translation_warmup_s
    points = []
    with contextlib.ExitStack() as stack:
        models = [model for name in PRECISIONS.values() for model in (name, f"{name}_stream")]
        server = start_server(stack, repository, models)
        for name in PRECISIONS.values():  # the first requests load ORT's arenas: not part of any window
            closed_loop(server.grpc_url, name, sentences[:2], 2, 1, NEW_TOKENS, max(0.5, warmup), 0.0)
        cells = [(clients, False) for clients in CLIENTS] + [(1, True)]
        for clients, stream in cells:
            for precision, name in PRECISIONS.items():
                what = f"served {precision}" + (" streams" if stream else "")
                print(f"[bench] llm {what} at {clients} clients", file=sys.stderr, flush=True)
                runs = [closed_loop(server.grpc_url, name, sentences, clients, 1, NEW_TOKENS, window, warmup, stream)
                        for _ in range(profile.repetitions)]  # fmt: skip
                summary = summarize_runs(runs)
                tokens = summary["throughput"]["median"] * NEW_TOKENS
                points.append({"runtime": f"served {precision}", "clients": clients, "stream": stream,
                               "tokens_per_s": tokens, **summary})  # fmt: skip
        memory = {"server_group_rss_mb": round(group_rss_mb(server.pid), 1), "stubs_rss_mb": stub_rss_mb(server)}
    return points, memory


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ours (offline at each batch; served, unary, at as many clients as the batch) ÷ each peer offline."""
    out = []
    for row in rows:
        if not row["runtime"].startswith(("ours", "served")) or row.get("stream"):
            continue
        precision = "int8" if "int8" in row["runtime"] else "fp32"
        batch = row.get("batch", row.get("clients"))
        for peer in (f"ctranslate2 {precision}", f"genai {precision}"):
            other = next(r for r in rows if r["runtime"] == peer and r.get("batch") == batch)
            out.append({"ours": row["runtime"], "batch": batch, "peer": peer,
                        "ratio": row["tokens_per_s"] / other["tokens_per_s"] if other["tokens_per_s"] else
                        float("nan")})  # fmt: skip
    return out


def bars(section: dict[str, Any]) -> list[dict[str, Any]]:
    from benchmarks.summary import bar

    return [
        bar(
            f"LLM ({section['model']}) served fp32 at {r['batch']} clients ≥ 1.0× {r['peer']} offline, batch "
            f"{r['batch']}",
            r["ratio"],
            BAR,
        )  # fmt: skip
        for r in section["ratios"]
        if r["ours"] == "served fp32" and r["batch"] == max(CLIENTS) and r["peer"].endswith("fp32")
    ]


def measure(profile: Profile, workdir: Path) -> dict[str, Any]:
    from export.import_hf.sample_folders import translation_pairs

    pairs, test = translation_pairs(profile.data_dir)
    folder, size = sample_folder(profile, workdir, pairs)
    models = prepare(folder, workdir)
    section: dict[str, Any] = {"model": size, "new_tokens": NEW_TOKENS, "cpu": cpu_info()}
    try:
        import onnxruntime_genai

        section["cpu"]["onnxruntime_genai"] = onnxruntime_genai.__version__
    except ImportError:
        pass
    section["offline"] = offline(models, test, profile.repetitions)
    section["served"], section["served_memory"] = served(models, test, profile)
    section["ratios"] = ratios(section["offline"] + section["served"])
    section["bars"] = bars(section)
    return section


def markdown(section: dict[str, Any]) -> list[str]:
    cpu = section["cpu"]
    lines = [
        f"## Decoder-only LLM ({section['model']}): ours vs CTranslate2 and ONNX Runtime GenAI, offline",
        "",
        f"Greedy, {section['new_tokens']} new tokens a prompt, translate's prompt in the chat template; CPU flags: "
        f"{', '.join(cpu.get('flags', [])) or 'not recorded'}; CTranslate2 {cpu.get('ctranslate2', '?')}, "
        f"ONNX Runtime GenAI {cpu.get('onnxruntime_genai', '?')}, ONNX Runtime {cpu.get('onnxruntime', '?')}.",
        "",
        "| runtime | batch | prompt tokens (p50) | tokens/s (median) | runs | time to first token ms | memory MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in section["offline"]:
        runs = ", ".join(f"{r:.1f}" for r in row["runs"])
        ttft = f"{row['ttft_ms']:.0f}" if "ttft_ms" in row else ""
        lines.append(f"| {row['runtime']} | {row['batch']} | {row['prompt_tokens_p50']:.0f} | "
                     f"{row['tokens_per_s']:.1f} | {runs} | {ttft} | {row['rss_mb']:.0f} |")  # fmt: skip
    stubs = section["served_memory"]["stubs_rss_mb"]
    lines += ["", "| served | clients | tokens/s | p50 ms | time to first token p50 ms | engine memory MB |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for point in section["served"]:
        name = PRECISIONS[point["runtime"].split()[-1]] + ("_stream" if point["stream"] else "")
        ttft = f"{point['ttft_p50_ms']['median']:.0f}" if point["stream"] else ""
        lines.append(f"| {point['runtime']}{' (streams)' if point['stream'] else ''} | {point['clients']} | "
                     f"{point['tokens_per_s']:.1f} | {point['p50_ms']['median']:.0f} | {ttft} | "
                     f"{stubs.get(f'{name}_0_0', float('nan')):.0f} |")  # fmt: skip
    lines += ["", f"Served memory: one engine process (its stub); tritonserver and all four stubs together: "
              f"{section['served_memory']['server_group_rss_mb']:.0f} MB."]  # fmt: skip
    lines += ["", "| ours | batch or clients | ÷ | ratio |", "|---|---|---|---|"]
    for r in section["ratios"]:
        lines.append(f"| {r['ours']} | {r['batch']} | {r['peer']} | {r['ratio']:.2f} |")
    return [*lines, ""]
