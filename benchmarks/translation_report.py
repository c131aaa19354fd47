"""The translation section's Markdown: the bars, the offline and served tables, streaming and the CPU's share
(benchmarks/translation.py drives the measurements; this renders its result)."""

from __future__ import annotations

from typing import Any

from benchmarks.closed_loop import CORES, LOAD
from benchmarks.markdown import cell, table
from benchmarks.translation import (
    BAR_P99,
    BAR_TTFT,
    BAR_VS_CT2,
    BAR_VS_TODAY,
    BEAMS,
    ENGINE_SERVER,
    SERVERS,
    TODAY_SERVER,
    beam_label,
)
from benchmarks.translation_offline import RUNTIMES, STREAM_MODEL
from benchmarks.variant_repository import GENERATION_FRONT, GENERATOR_MODEL


def _percent(fraction: float) -> str:
    """A share as the report prints it: one decimal, since the streaming bar's ratio sits near its 20%."""
    return f"{fraction * 100:.1f}%"


def _tail_words(row: dict[str, Any]) -> str:
    """What the engine's slowest requests were: their answers' median length against all answers'."""
    if "p99_engine_slowest_answer_words_p50" not in row:
        return ""
    return (
        f"; the engine's requests at or above its p99 had answers of {row['p99_engine_slowest_answer_words_p50']:.0f}"
        f" words (median), against {row['p99_engine_answer_words_p50']:.0f} over all"
    )


def _certain_words(row: dict[str, Any]) -> str:
    """The floor exact streaming sets under the TTFT bar (certain_text_steps), where it was measured."""
    if "certain_first_text_share_p50" not in row:
        return ""
    return (
        f"; decoded offline, the first text is certain after {row['certain_first_text_step_p50']:g} of "
        f"{row['certain_steps_p50']:g} steps (median; median share {_percent(row['certain_first_text_share_p50'])}),"
        " a floor under this ratio before any serving cost"
    )


def _bar_lines(section: dict[str, Any]) -> list[str]:
    lines = []
    for r in section["ratios"]:
        label = beam_label(r["beams"])

        def mark(met: bool) -> str:
            return "met" if met else "**missed**"

        lines += [
            f"- served ≥ 1.0× CTranslate2 offline ({label}): {mark(r['served_vs_ctranslate2'] >= BAR_VS_CT2)}, "
            f"{r['served_vs_ctranslate2']:.2f}× (engine served {r['engine_served_sentences_per_s']:.1f} sentences/s at "
            f"{r['clients']} clients ÷ CTranslate2 fp32 {r['ctranslate2_fp32_offline_sentences_per_s']:.1f} at "
            f"{r['ctranslate2_fp32_threads']} thread(s))",
            f"- ≥ 2× today's served translate ({label}): {mark(r['served_vs_today'] >= BAR_VS_TODAY)}, "
            f"{r['served_vs_today']:.2f}× ({r['engine_served_sentences_per_s']:.1f} ÷ "
            f"{r['today_served_sentences_per_s']:.1f} sentences/s at {r['clients']} clients)",
            f"- p99 at {r['p99_clients']} clients not worse ({label}): "
            f"{mark(r['p99_engine_vs_today'] <= BAR_P99)}, engine {r['p99_engine_ms']:.0f} ms vs today "
            f"{r['p99_today_ms']:.0f} ms ({r['p99_engine_vs_today']:.2f}×){_tail_words(r)}",
        ]
        if "ttft_vs_full" in r:
            lines.append(
                f"- streaming TTFT ≤ 20% of full latency at {r['stream_clients']} clients ({label}): "
                f"{mark(r['ttft_vs_full'] <= BAR_TTFT)}, median TTFT {r['ttft_ms']:.0f} ms ÷ median full "
                f"{r['full_ms']:.0f} ms = {_percent(r['ttft_vs_full'])}{_certain_words(r)}"
            )
    return lines


def markdown(section: dict[str, Any]) -> list[str]:
    cpu = section["cpu"]
    threads = sorted({r["threads"] for r in section["offline"]})
    rows = []
    for beams in BEAMS:
        for runtime in RUNTIMES:
            cells = []
            for t in threads:
                row = next(
                    r for r in section["offline"] if (r["runtime"], r["beams"], r["threads"]) == (runtime, beams, t)
                )
                cells.append(f"{cell(row['sentences_per_s'], 1)} ({row['tokens_per_s']['median']:.0f})")
            rows.append([beam_label(beams), runtime, *cells])
    served_rows = []
    for p in section["served"]:
        cells = [
            f"{cell(p['servers'][n]['throughput'], 1)} ({p['servers'][n]['p50_ms']['median']:.0f}/"
            f"{p['servers'][n]['p99_ms']['median']:.0f})"
            for n in SERVERS
        ]
        ratio = p["servers"][ENGINE_SERVER]["throughput"]["median"] / p["servers"][TODAY_SERVER]["throughput"]["median"]
        errors = sum(p["servers"][n]["errors"]["median"] for n in SERVERS)
        served_rows.append([str(p["clients"]), beam_label(p["beams"]), *cells, f"{ratio:.2f}×", f"{errors:.0f}"])
    cpu_rows = [
        [str(p["clients"]), beam_label(p["beams"]), name, *_cpu_cells(p["servers"][name])]
        for p in section["served"]
        for name in SERVERS
        if any(key.startswith(CORES) for key in p["servers"][name])
    ]
    stream_rows = [
        [
            str(s["clients"]),
            beam_label(s["beams"]),
            cell(s["ttft_p50_ms"]),
            cell(s["p50_ms"]),
            _percent(s["ttft_p50_ms"]["median"] / s["p50_ms"]["median"]),
            f"{s['ttft_p99_ms']['median']:.0f} / {s['p99_ms']['median']:.0f}",
            _certain_cell(s),
        ]
        for s in section["streaming"]
    ]
    source = section["texts_source"]
    return [
        "## 6. Translation: the continuous-batching engine vs CTranslate2 and today's served translate",
        "",
        f"{section['sentences']} sentences ({source}, file order), batch {section['batch']}, at most "
        f"{section['max_new_tokens']} new tokens. CPU flags: {', '.join(cpu['flags']) or 'none found'}; "
        f"CTranslate2 {cpu.get('ctranslate2', '?')} (CPU compute types "
        f"{', '.join(cpu.get('ctranslate2_cpu_compute_types', [])) or '?'}), onnxruntime {cpu['onnxruntime']}.",
        "",
        "**Offline**: sentences/s (generated tokens/s), one warm-up pass then median [min–max] of the timed passes; "
        "the engine gets every sentence at once with max_rows = 32 × beams.",
        "",
        *table(["search", "runtime", *(f"{t} thread(s)" for t in threads)], rows),
        "",
        f"**Served, closed loop** over gRPC, one sentence per request, {section['window_s']:g} s window after "
        f"{section['warmup_s']:g} s warm-up: sentences/s (p50/p99 ms). `{ENGINE_SERVER}`: model_repository as "
        f'built, `translate` on the continuous-batching engine; `{TODAY_SERVER}` ("today" in the bars): a copy '
        f"whose `translate` is {GENERATION_FRONT.split(':')[1]} calling {GENERATOR_MODEL} by BLS, with the same "
        "front instances.",
        "",
        *table(["clients", "search", *SERVERS, "engine ÷ today", "errors"], served_rows),
        "",
        "**Where the CPU goes** while those loads ran (medians): cores used by tritonserver, by the models' Python "
        "stubs, and by this process, whose client threads are the load; CPU ms per sentence = all of them ÷ "
        "sentences/s.",
        "",
        *table(["clients", "search", "server", "tritonserver", "stubs", "load", "all", "CPU ms / sentence"], cpu_rows),
        "",
        f"**Streaming** (`{STREAM_MODEL}`): time to the first non-empty piece and to the final response, ms. First "
        "text certain: the engine decoding the same sentences offline, the step after which a stream's first text "
        "is certain (every live beam and kept hypothesis starts with it) of the steps to the answer, medians "
        "(median of the per-sentence shares).",
        "",
        *table(
            ["clients", "search", "median TTFT", "median full", "TTFT ÷ full", "p99 TTFT / full", "first text certain"],
            stream_rows,
        ),
        "",
        "**Bars**",
        "",
        *_bar_lines(section),
        "",
    ]


def _certain_cell(stream: dict[str, Any]) -> str:
    certain = stream.get("certain_text")
    if certain is None:
        return ""
    share = _percent(certain["first_text_share_p50"])
    return f"step {certain['first_text_step_p50']:g} of {certain['steps_p50']:g} ({share})"


def _cpu_cells(point: dict[str, Any]) -> list[str]:
    """tritonserver, stubs (summed over models), load, all: cores; then CPU ms per served sentence."""
    cores = {key.removeprefix(CORES): value["median"] for key, value in point.items() if key.startswith(CORES)}
    stubs = sum(value for kind, value in cores.items() if kind.startswith("stub "))
    server, load = cores.get("tritonserver", 0.0), cores.get(LOAD, 0.0)
    used = server + stubs + load
    per_sentence = used / point["throughput"]["median"] * 1e3
    return [f"{server:.2f}", f"{stubs:.2f}", f"{load:.2f}", f"{used:.2f}", f"{per_sentence:.2f}"]
