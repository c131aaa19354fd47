"""Comparison 6, translation: the continuous-batching engine against CTranslate2 and the BeamSearch-op front.

This module drives the section; benchmarks/translation_offline.py times the runtimes offline,
benchmarks/closed_loop.py is the served load, benchmarks/variant_repository.py builds the baseline's repository and
benchmarks/translation_report.py renders the result. Everything in one run on one machine, so the ratios compare
like with like:

1. offline, Tatoeba test sentences in file order, batch 32, the served token budget, greedy and beam 4, at 1 and 2
   intra-op threads: CTranslate2 fp32 and int8 (the checkpoint converted once into the work folder), the ONNX
   BeamSearch generator, and the engine (every sentence submitted at once, max_rows = 32 × beams, so it never
   decodes more sources at once than a batch holds). Each: one warm-up pass, then the median of the timed passes
   (benchmarks/ctranslate2_baseline.py's protocol);
2. served, closed loop: the real Triton on model_repository as built (`translate` on the engine) and on a copy
   whose `translate` is the setup the engine replaced ("today's" when the bars were set: the BLS front calling the
   BeamSearch generator, two front instances); 16 and 32 gRPC client threads, one test sentence per request, a
   fixed window after a warm-up; the two servers run side by side but only one is loaded at a time (repetitions
   interleaved);
3. streaming: `translate_stream` on the engine at 16 clients: time to the first non-empty piece and to the final
   response of every request; and offline, how many steps in a stream's first text becomes certain
   (:func:`certain_text_steps`), the floor exact streaming puts under the time to the first piece;
4. the ratios and bars (:func:`bars`).
"""

from __future__ import annotations

import contextlib
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import data
from benchmarks.checks import check
from benchmarks.closed_loop import TAIL_WORDS, closed_loop, start_server, with_cores
from benchmarks.profiles import REPOSITORY, Profile
from benchmarks.stats import cpu_flags, interleaved, summarize_runs
from benchmarks.translation_offline import BATCH, CT2_FP32, STREAM_MODEL, certain_text_steps, offline
from benchmarks.variant_repository import GENERATOR_MODEL, build_translate_variant

DATASET = "translate_test"  # the key of benchmarks.data.FILES for the test file
TASK = "translate"
BEAMS = (1, 4)
ENGINE_SERVER, TODAY_SERVER = "engine", "generation_front"  # served: model_repository; the BeamSearch-op variant
SERVERS = (ENGINE_SERVER, TODAY_SERVER)
# Bars: served engine vs CTranslate2 offline, vs today's served translate, p99 not worse, TTFT share.
BAR_VS_CT2, BAR_VS_TODAY, BAR_P99, BAR_TTFT = 1.0, 2.0, 1.0, 0.2


def beam_label(beams: int) -> str:
    return "greedy" if beams == 1 else f"beam {beams}"


# -- inputs ---------------------------------------------------------------------------------------------------


def test_sentences(profile: Profile) -> tuple[list[str], str]:
    """The first ``translation_sentences`` Tatoeba test sentences (Chinese side, file order), and their source;
    without the file, the load test's built-in sentences cycled to that count."""
    from benchmarks.ctranslate2_baseline import read_test_sentences

    count = profile.translation_sentences
    if data.available(profile.data_dir, DATASET):
        return read_test_sentences(profile.data_dir)[:count], "Tatoeba test split"
    return data.fallback_texts(TASK, count), data.BUILT_IN


def max_new_tokens(profile: Profile) -> int:
    from benchmarks.ctranslate2_baseline import served_max_new_tokens

    return profile.translation_new_tokens or served_max_new_tokens()


def cpu_info() -> dict[str, Any]:
    """What decides which kernels CTranslate2 and ONNX Runtime pick: the ISA flags and the runtimes' versions."""
    import onnxruntime

    info: dict[str, Any] = {"flags": cpu_flags(), "onnxruntime": onnxruntime.__version__}
    with contextlib.suppress(ImportError):
        import ctranslate2

        info["ctranslate2"] = ctranslate2.__version__
        info["ctranslate2_cpu_compute_types"] = sorted(ctranslate2.get_supported_compute_types("cpu"))
    return info


# -- served ---------------------------------------------------------------------------------------------------


def served(profile: Profile, sentences: list[str], workdir: Path) -> tuple[list[dict], list[dict]]:
    """The closed-loop points (clients × beams, both servers interleaved) and the streaming points."""
    new_tokens, window, warmup = max_new_tokens(profile), profile.translation_seconds, profile.translation_warmup_s
    baseline = build_translate_variant(workdir / "repositories")
    with contextlib.ExitStack() as stack:
        servers = {
            ENGINE_SERVER: start_server(stack, REPOSITORY, [TASK, STREAM_MODEL]),
            TODAY_SERVER: start_server(stack, baseline, [TASK, GENERATOR_MODEL]),
        }
        # First requests load tokenizers, ORT arenas and the generator's subgraphs: not part of any window.
        for server in servers.values():
            for beams in BEAMS:
                closed_loop(server.grpc_url, TASK, sentences, 2, beams, new_tokens, max(0.5, warmup), 0.0)
        points = []
        for clients in profile.translation_clients:
            for beams in BEAMS:
                calls = {
                    name: partial(
                        with_cores,
                        partial(
                            closed_loop, server.grpc_url, TASK, sentences, clients, beams, new_tokens, window, warmup
                        ),
                    )
                    for name, server in servers.items()
                }
                runs = interleaved(calls, profile.repetitions, desc=f"translate c{clients} {beam_label(beams)}")
                points.append(
                    {
                        "clients": clients,
                        "beams": beams,
                        "servers": {name: summarize_runs(r) for name, r in runs.items()},
                    }
                )
        streaming = []
        engine_url = servers[ENGINE_SERVER].grpc_url  # the streaming twin, as built
        clients = profile.translation_stream_clients
        for beams in BEAMS:
            closed_loop(engine_url, TASK, sentences, 2, beams, new_tokens, max(0.5, warmup), 0.0, True)
            runs = [
                closed_loop(engine_url, TASK, sentences, clients, beams, new_tokens, window, warmup, True)
                for _ in range(profile.repetitions)
            ]
            certain = certain_text_steps(sentences, beams, new_tokens)  # offline, between loads
            streaming.append({"clients": clients, "beams": beams, **summarize_runs(runs), "certain_text": certain})
    return points, streaming


# -- ratios and bars ------------------------------------------------------------------------------------------


def _best_offline(section: dict[str, Any], runtime: str, beams: int) -> tuple[float, int]:
    """(median sentences/s, threads) of a runtime at its better thread count."""
    rows = [r for r in section["offline"] if r["runtime"] == runtime and r["beams"] == beams]
    best = max(rows, key=lambda r: r["sentences_per_s"]["median"])
    return best["sentences_per_s"]["median"], best["threads"]


def _point(section: dict[str, Any], clients: int, beams: int) -> dict[str, Any]:
    return next(p for p in section["served"] if p["clients"] == clients and p["beams"] == beams)


def ratios(section: dict[str, Any]) -> list[dict[str, Any]]:
    """Per beam setting: served engine sentences/s (at the most clients) ÷ CTranslate2 fp32 offline (its better
    thread count) and ÷ today's served translate; p99 engine ÷ today's at the fewest clients; streaming median
    time to first piece ÷ median time to the final response."""
    out = []
    top, fewest = max(section["clients"]), min(section["clients"])
    for beams in BEAMS:
        ct2, ct2_threads = _best_offline(section, CT2_FP32, beams)
        at_top, at_fewest = _point(section, top, beams)["servers"], _point(section, fewest, beams)["servers"]
        engine, today = at_top[ENGINE_SERVER]["throughput"]["median"], at_top[TODAY_SERVER]["throughput"]["median"]
        p99_engine = at_fewest[ENGINE_SERVER]["p99_ms"]["median"]
        p99_today = at_fewest[TODAY_SERVER]["p99_ms"]["median"]
        words = {key: at_fewest[ENGINE_SERVER][key]["median"] for key in TAIL_WORDS if key in at_fewest[ENGINE_SERVER]}
        row: dict[str, Any] = {
            "beams": beams,
            "clients": top,
            "engine_served_sentences_per_s": engine,
            "today_served_sentences_per_s": today,
            "ctranslate2_fp32_offline_sentences_per_s": ct2,
            "ctranslate2_fp32_threads": ct2_threads,
            "served_vs_ctranslate2": engine / ct2,
            "served_vs_today": engine / today,
            "p99_clients": fewest,
            "p99_engine_ms": p99_engine,
            "p99_today_ms": p99_today,
            "p99_engine_vs_today": p99_engine / p99_today,
            **{f"p99_engine_{key}": value for key, value in words.items()},
        }
        stream = next((s for s in section.get("streaming", []) if s["beams"] == beams), None)
        if stream is not None:
            ttft, full = stream["ttft_p50_ms"]["median"], stream["p50_ms"]["median"]
            row |= {"stream_clients": stream["clients"], "ttft_ms": ttft, "full_ms": full, "ttft_vs_full": ttft / full}
            row |= {f"certain_{key}": value for key, value in stream.get("certain_text", {}).items()}
        out.append(row)
    return out


def bars(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The four bars per beam setting, as benchmarks.checks entries (name, value, bar, met)."""
    out = []
    for r in section["ratios"]:
        label = beam_label(r["beams"])
        out += [
            check(f"translate served ≥ 1.0× CTranslate2 offline ({label})", r["served_vs_ctranslate2"], BAR_VS_CT2),
            check(f"translate served ≥ 2× today's served translate ({label})", r["served_vs_today"], BAR_VS_TODAY),
            check(
                f"translate p99 at {r['p99_clients']} clients not worse, engine ÷ today ({label})",
                r["p99_engine_vs_today"],
                BAR_P99,
                higher_is_better=False,
            ),
        ]
        if "ttft_vs_full" in r:
            out.append(
                check(
                    f"streaming TTFT ≤ 20% of full latency at {r['stream_clients']} clients ({label})",
                    r["ttft_vs_full"],
                    BAR_TTFT,
                    higher_is_better=False,
                )
            )
    return out


# -- the section ----------------------------------------------------------------------------------------------


def measure(profile: Profile, workdir: Path) -> dict[str, Any]:
    sentences, source = test_sentences(profile)
    section: dict[str, Any] = {
        "sentences": len(sentences),
        "texts_source": source,
        "batch": BATCH,
        "max_new_tokens": max_new_tokens(profile),
        "beams": list(BEAMS),
        "threads": list(profile.translation_threads),
        "clients": list(profile.translation_clients),
        "window_s": profile.translation_seconds,
        "warmup_s": profile.translation_warmup_s,
        "cpu": cpu_info(),
    }
    section["offline"] = offline(
        sentences, workdir, BEAMS, profile.translation_threads, section["max_new_tokens"], profile.repetitions
    )
    section["served"], section["streaming"] = served(profile, sentences, workdir)
    section["ratios"] = ratios(section)
    section["bars"] = bars(section)
    return section
