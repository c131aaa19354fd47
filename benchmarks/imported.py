"""`imported`: a Hugging Face MarianMTModel of opus-mt-zh-en's shape (6 + 6 layers, d_model 512, 8 heads, a
vocabulary over 30 k; export/import_hf/sample_folders.py builds it, no hub here) served through our engine after
`python -m export.import_hf`, against CTranslate2 offline on the same folder converted by its own converter
(`TransformersConverter`, what `ct2-transformers-converter --model DIR` runs).

- CTranslate2 offline: `translate_batch` over the test sentences (batches of 32, MarianTokenizer's pieces), fp32
  and int8, 1 and 2 intra-op threads and both GEMM backends (the best counts), greedy and beam 4, in a process of
  its own (ctranslate2 and numpy only) whose resident memory is reported.
- Served: the real Triton server with the imported task in fp32 and int8 (one engine of two threads each),
  closed-loop gRPC clients (benchmarks/closed_loop.py): single sentences (16 clients), and paragraphs of 8
  consecutive test sentences (8 clients; the endpoint splits them, each sentence a row of the running batch).
  Throughput in sentences/s; the server's resident memory (tritonserver and its stubs).

Both sides decode at most NEW_TOKENS tokens. The sample model's weights are random (OPUS_MT says why), so it
rarely ends a sentence early: every answer is about NEW_TOKENS tokens on both sides, the same work.
The bar: served fp32 ≥ 1.0× CTranslate2 offline fp32 on paragraphs of 8, greedy and beam 4.

    python -m benchmarks --sections imported --name imported   # → benchmarks/results/imported.json, .md
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.closed_loop import closed_loop, start_server, with_cores
from benchmarks.profiles import ROOT, Profile
from benchmarks.stats import interleaved, summarize_runs
from benchmarks.translation import cpu_info

SAMPLES = ROOT / ".cache" / "hf-samples"  # the built folder is kept: building it costs minutes
NAME = "opus_bench"
PRECISIONS = {"fp32": NAME, "int8": f"{NAME}_int8"}
BEAMS = (1, 4)
NEW_TOKENS = 32
PARAGRAPH = 8
SENTENCE_CLIENTS, PARAGRAPH_CLIENTS = 16, 8
CT2_BATCH = 32
SENTENCES = 160  # at most: 20 paragraphs of 8; a model this size takes seconds per pass
CT2_THREADS = (1, 2)
# CTranslate2's GEMM backends (CT2_USE_MKL): oneDNN, its default on AMD CPUs, and Intel MKL; the better one counts
CT2_BACKENDS = {"oneDNN": "0", "MKL": "1"}
BAR = 1.0


def sample_folder(profile: Profile, workdir: Path, pairs: list[tuple[str, str]]) -> tuple[Path, str]:
    """The Marian folder the section measures: opus-mt's shape (cached), or a small one for the smoke run."""
    from export.import_hf.sample_folders import OPUS_MT, TINY, build_marian

    if profile.name == "smoke":
        return build_marian(workdir / "tiny", replace(TINY, train_steps=20), pairs), "tiny"
    folder = SAMPLES / "opus_mt"
    if not (folder / "model.safetensors").is_file():
        build_marian(folder, OPUS_MT, pairs)
    return folder, "opus_mt"


def import_both(folder: Path, workdir: Path, precisions: dict[str, str] = PRECISIONS) -> tuple[Path, Path]:
    """The folder imported twice (fp32, int8: `precisions` names each) into a repository of its own; (repository,
    tasks folder). The checkpoints go to `workdir`/checkpoints."""
    checkpoints, tasks, repository = workdir / "checkpoints", workdir / "tasks", workdir / "repository"
    for precision, name in precisions.items():
        flags = ["--int8"] if precision == "int8" else []
        run_module("-m", "export.import_hf", str(folder), "--task", "translate", "--name", name, *flags,
                   "--checkpoints", str(checkpoints), "--tasks-dir", str(tasks))  # fmt: skip
    names = [flag for name in precisions.values() for flag in ("--task", name)]
    env = {"ROPESERVE_TASKS_PATH": str(tasks)}
    run_module("-m", "tasks", "generate", *names, "--repository", str(repository), env=env)
    run_module("-m", "export.build_repository", *names, "--repository", str(repository),
               "--checkpoints", str(checkpoints), env=env)  # fmt: skip
    return repository, tasks


def run_module(*argv: str, env: dict[str, str] | None = None) -> None:
    """`python -m ...` in the project's folder, failing loudly; `env` on top of this process's."""
    subprocess.run([sys.executable, *argv], cwd=ROOT, check=True, env={**os.environ, **(env or {})})


# -- CTranslate2, offline ----------------------------------------------------------------------------------------


def ct2_offline(folder: Path, sentences: list[str], workdir: Path, repetitions: int) -> list[dict[str, Any]]:
    from ctranslate2.converters import TransformersConverter
    from transformers import MarianTokenizer

    tokenizer = MarianTokenizer.from_pretrained(folder)
    tokens = [tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"]) for text in sentences]
    rows = []
    for precision, quantization in (("fp32", None), ("int8", "int8")):
        converted = workdir / f"ct2-{precision}"
        TransformersConverter(str(folder)).convert(str(converted), quantization=quantization, force=True)
        for backend, use_mkl in CT2_BACKENDS.items():
            rows += _in_own_process(str(converted), precision, backend, use_mkl, tokens, repetitions)
    return rows


def _in_own_process(model: str, precision: str, backend: str, use_mkl: str, tokens: list[list[str]],
                    repetitions: int) -> list[dict[str, Any]]:  # fmt: skip
    """CTranslate2's rows, measured in a process of its own (nothing else in its memory) with its GEMM backend."""
    from benchmarks import ct2_worker

    saved = os.environ.get("CT2_USE_MKL")
    os.environ["CT2_USE_MKL"] = use_mkl  # read when the spawned process loads ctranslate2
    try:
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
            job = pool.submit(ct2_worker.rows, model, precision, tokens, BEAMS, CT2_THREADS, NEW_TOKENS, CT2_BATCH,
                              repetitions)  # fmt: skip
            return [row | {"backend": backend} for row in job.result()]
    finally:
        if saved is None:
            os.environ.pop("CT2_USE_MKL")
        else:
            os.environ["CT2_USE_MKL"] = saved


# -- served ------------------------------------------------------------------------------------------------------


def served(repository: Path, sentences: list[str], profile: Profile) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from benchmarks.soak import stub_rss_mb
    from serving.launcher.processes import group_rss_mb

    paragraphs = ["".join(sentences[i : i + PARAGRAPH]) for i in range(0, len(sentences) - PARAGRAPH + 1, PARAGRAPH)]
    loads = {"sentences": (sentences, SENTENCE_CLIENTS, 1), f"paragraphs of {PARAGRAPH}": (paragraphs,
             PARAGRAPH_CLIENTS, PARAGRAPH)}  # fmt: skip
    window, warmup = profile.translation_seconds, profile.translation_warmup_s
    points = []
    with contextlib.ExitStack() as stack:
        models = [name for base in PRECISIONS.values() for name in (base, f"{base}_stream")]
        server = start_server(stack, repository, models)
        for name in PRECISIONS.values():  # first requests load ORT arenas: not part of any window
            for beams in BEAMS:
                closed_loop(server.grpc_url, name, paragraphs[:2], 2, beams, NEW_TOKENS, max(0.5, warmup), 0.0)
        for load, (texts, clients, per_text) in loads.items():
            for beams in BEAMS:
                calls = {
                    precision: partial(
                        with_cores,
                        partial(closed_loop, server.grpc_url, name, texts, clients, beams, NEW_TOKENS, window, warmup),
                    )  # fmt: skip
                    for precision, name in PRECISIONS.items()
                }
                runs = interleaved(calls, profile.repetitions, desc=f"imported {load} beams {beams}")
                for precision, results in runs.items():
                    summary = summarize_runs(results)
                    rate = summary["throughput"]["median"] * per_text
                    points.append({"runtime": f"served {precision}", "load": load, "clients": clients, "beams": beams,
                                   "sentences_per_s": rate, **summary})  # fmt: skip
        memory = {"server_group_rss_mb": round(group_rss_mb(server.pid), 1), "stubs_rss_mb": stub_rss_mb(server)}
    return points, memory


# -- the section -------------------------------------------------------------------------------------------------


def best_ct2(rows: list[dict[str, Any]], precision: str, beams: int) -> dict[str, Any]:
    candidates = [r for r in rows if r["runtime"] == f"ctranslate2 {precision}" and r["beams"] == beams]
    return max(candidates, key=lambda r: r["sentences_per_s"])


def ratios(section: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for point in section["served"]:
        precision = point["runtime"].split()[-1]
        for baseline in ("fp32", precision):
            ct2 = best_ct2(section["offline"], baseline, point["beams"])
            setting = f"{ct2['threads']} threads, {ct2['backend']}"
            out.append({"served": point["runtime"], "load": point["load"], "beams": point["beams"],
                        "ctranslate2": ct2["runtime"], "ctranslate2_setting": setting,
                        "ratio": point["sentences_per_s"] / ct2["sentences_per_s"]})  # fmt: skip
    unique = {(r["served"], r["load"], r["beams"], r["ctranslate2"]): r for r in out}
    return list(unique.values())


def bars(section: dict[str, Any]) -> list[dict[str, Any]]:
    from benchmarks.summary import bar

    return [
        bar(
            f"imported opus-mt-sized Marian served fp32 ≥ 1.0× CTranslate2 offline fp32 ({r['load']}, "
            f"{'greedy' if r['beams'] == 1 else 'beam ' + str(r['beams'])})",
            r["ratio"],
            BAR,
        )  # fmt: skip
        for r in section["ratios"]
        if r["served"] == "served fp32" and r["ctranslate2"] == "ctranslate2 fp32" and r["load"].startswith("para")
    ]


def measure(profile: Profile, workdir: Path) -> dict[str, Any]:
    from export.import_hf.sample_folders import translation_pairs

    pairs, test = translation_pairs(profile.data_dir)
    sentences = test[: min(profile.translation_sentences, SENTENCES)]
    folder, size = sample_folder(profile, workdir, pairs)
    repository, _ = import_both(folder, workdir)
    section: dict[str, Any] = {
        "model": size,
        "sentences": len(sentences),
        "new_tokens": NEW_TOKENS,
        "ctranslate2_batch": CT2_BATCH,
        "window_s": profile.translation_seconds,
        "cpu": cpu_info(),
    }
    section["offline"] = ct2_offline(folder, sentences, workdir, profile.repetitions)
    section["served"], section["served_memory"] = served(repository, sentences, profile)
    section["ratios"] = ratios(section)
    section["bars"] = bars(section)
    return section


def markdown(section: dict[str, Any]) -> list[str]:
    """The section's tables for the run's .md: every cell as measured, and the ratios."""
    cpu = section["cpu"]
    lines = [
        f"## Imported Marian ({section['model']}) served vs CTranslate2 offline",
        "",
        f"{section['sentences']} Tatoeba test sentences, at most {section['new_tokens']} new tokens; CPU flags: "
        f"{', '.join(cpu.get('flags', [])) or 'not recorded'}; CTranslate2 {cpu.get('ctranslate2', '?')}.",
        "",
        "| runtime | load | beams | threads / clients | sentences/s | p50 ms | memory MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in section["offline"]:
        lines.append(f"| {row['runtime']} | batches of {section['ctranslate2_batch']} | {row['beams']} | "
                     f"{row['threads']} threads, {row['backend']} | {row['sentences_per_s']:.1f} | | "
                     f"{row['rss_mb']:.0f} |")  # fmt: skip
    stubs = section["served_memory"]["stubs_rss_mb"]
    for point in section["served"]:
        memory = stubs.get(f"{PRECISIONS[point['runtime'].split()[-1]]}_0_0", float("nan"))
        lines.append(f"| {point['runtime']} | {point['load']} | {point['beams']} | {point['clients']} clients | "
                     f"{point['sentences_per_s']:.1f} | {point['p50_ms']['median']:.0f} | {memory:.0f} |")  # fmt: skip
    lines += ["", f"Served memory: the endpoint's engine process (its stub); tritonserver and all four stubs (fp32, "
              f"int8 and their streaming twins) together: {section['served_memory']['server_group_rss_mb']:.0f} MB. "
              "CTranslate2: its process after the runs."]  # fmt: skip
    lines += ["", "| served | load | beams | ÷ | ratio |", "|---|---|---|---|---|"]
    for r in section["ratios"]:
        lines.append(f"| {r['served']} | {r['load']} | {r['beams']} | {r['ctranslate2']} "
                     f"({r['ctranslate2_setting']}) | {r['ratio']:.2f} |")  # fmt: skip
    return [*lines, ""]
