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
repeated prompt. Served cells (the real Triton server, closed-loop clients) are not in this section yet.

    python -m benchmarks --sections llm --name llm   # → benchmarks/results/llm.json, .md
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.profiles import ROOT, Profile
from benchmarks.translation import cpu_info

SAMPLES = ROOT / ".cache" / "hf-samples"  # the built folder is kept: building it costs minutes
NAME = "llm_bench"
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


def _run(*argv: str) -> None:
    subprocess.run([sys.executable, *argv], cwd=ROOT, check=True)


def prepare(folder: Path, workdir: Path) -> dict[str, Path]:
    """Each runtime's model, converted by its own tool: ours (fp32 and int8 in one import), CTranslate2's and
    GenAI's per precision."""
    from ctranslate2.converters import TransformersConverter

    checkpoints = workdir / "checkpoints"
    _run("-m", "export.import_hf", str(folder), "--task", "translate", "--name", NAME, "--int8",
         "--checkpoints", str(checkpoints), "--tasks-dir", str(workdir / "tasks"))  # fmt: skip
    models = {"ours": checkpoints / NAME}
    for precision, quantization in (("fp32", None), ("int8", "int8")):
        out = workdir / f"ct2-{precision}"
        TransformersConverter(str(folder)).convert(str(out), quantization=quantization, force=True)
        models[f"ctranslate2 {precision}"] = out
        out = workdir / f"genai-{precision}"
        _run("-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o", str(out), "-p", precision, "-e", "cpu")
        models[f"genai {precision}"] = out
    return models


def prompt_passes(checkpoint: Path, sentences: list[str], batch: int, passes: int) -> list[list[list[int]]]:
    """`passes` lists of prompt ids (the first is the warm-up), each of its own sentences."""
    import json

    from tokenizers import Tokenizer

    from serving.text.chat import ChatPrompt
    from tasks import load

    task = load(checkpoint.parent.parent / "tasks" / f"{NAME}.toml")
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


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        if not row["runtime"].startswith("ours"):
            continue
        precision = "int8" if "int8" in row["runtime"] else "fp32"
        for peer in (f"ctranslate2 {precision}", f"genai {precision}"):
            other = next(r for r in rows if r["runtime"] == peer and r["batch"] == row["batch"])
            out.append({"ours": row["runtime"], "batch": row["batch"], "peer": peer,
                        "ratio": row["tokens_per_s"] / other["tokens_per_s"] if other["tokens_per_s"] else
                        float("nan")})  # fmt: skip
    return out


def bars(section: dict[str, Any]) -> list[dict[str, Any]]:
    from benchmarks.summary import bar

    return [
        bar(f"LLM ({section['model']}) ours fp32 ≥ 1.0× {r['peer']} offline, batch {r['batch']}", r["ratio"], BAR)
        for r in section["ratios"]
        if r["ours"] == "ours fp32" and r["batch"] == max(BATCHES) and r["peer"].endswith("fp32")
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
    section["ratios"] = ratios(section["offline"])
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
    lines += ["", "| ours | batch | ÷ | ratio |", "|---|---|---|---|"]
    for r in section["ratios"]:
        lines.append(f"| {r['ours']} | {r['batch']} | {r['peer']} | {r['ratio']:.2f} |")
    return [*lines, ""]
