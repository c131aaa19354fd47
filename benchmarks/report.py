"""The Markdown report of one run: machine, then one table per comparison, then the bars of the issue."""

from __future__ import annotations

from typing import Any

from benchmarks import data, documents, gateway, generation, imported, llm, runtime, threads, translation_report
from benchmarks.markdown import cell, table


def _pair(summaries: dict[str, Any], name: str, digits: int = 0) -> str:
    """'all cores / 1 thread' medians of one variant, the better one in bold."""
    fmt = f"{{:.{digits}f}}"
    best = threads.best({n: s["median"] for n, s in summaries.items()}, name)[0]
    cells = []
    for variant in (name, name + threads.ONE_THREAD_SUFFIX):
        text = fmt.format(summaries[variant]["median"])
        cells.append(f"**{text}**" if variant == best else text)
    return " / ".join(cells)


def _ratio(summaries: dict[str, Any], numerator: str, denominator: str) -> str:
    medians = {n: s["median"] for n, s in summaries.items()}
    return f"{threads.best(medians, numerator)[1] / threads.best(medians, denominator)[1]:.2f}×"


def _runtime(section: dict[str, Any]) -> list[str]:
    names = [runtime.EAGER, runtime.DECOMPOSED, runtime.FUSED, runtime.INT8]
    rows = []
    for shape in section["shapes"]:
        rates = shape["sequences_per_s"]
        rows.append(
            [str(shape["batch"]), str(shape["sequence"]), *(_pair(rates, n) for n in names)]
            + [_ratio(rates, runtime.FUSED, runtime.EAGER), _ratio(rates, runtime.INT8, runtime.FUSED)]
        )
    accuracy = section["accuracy"]
    unmeasured = accuracy.get("not_measured")
    if unmeasured:
        rows.append(["accuracy", "", *(["not measured"] * len(names)), "", ""])
    else:
        rows.append(["accuracy", f"n={accuracy['n']}", *(f"{accuracy[n] * 100:.2f}%" for n in names), "", ""])
    header = ["batch", "seq", *names, "fused/eager", "int8/fused"]
    excluded = ", ".join(section["variants"][runtime.INT8]["excluded_from_quantization"]) or "none"
    return [
        "## 1. Model runtime: sentiment encoder (sequences/s, all cores / 1 thread; better one in bold)",
        "",
        *table(header, rows),
        "",
        *([f"Accuracy: not measured ({unmeasured}).", ""] if unmeasured else []),
        "Ratios compare each variant at its better thread count. "
        f"int8: dynamic quantization of MatMul weights; RoPE-path nodes excluded: {excluded}.",
        "",
    ]


def _generation(section: dict[str, Any]) -> list[str]:
    names = list(generation.BASE_VARIANTS)
    rows = []
    for row in section["rows"]:
        sps, tps = row["sentences_per_s"], row["tokens_per_s"]
        rows.append(
            [row["task"], str(row["batch"]), str(row["max_new_tokens"])]
            + [f"{_pair(sps, n, 1)} ({_pair(tps, n)})" for n in names]
            + [_ratio(sps, generation.OP_GREEDY, generation.EAGER)]
        )
    header = ["task", "batch", "new tokens", *names, "op greedy/eager"]
    title = "## 2. Generation: sentences/s (generated tokens/s), all cores / 1 thread"
    built_in = sorted({row["task"] for row in section["rows"] if row.get("texts") == data.BUILT_IN})
    note = [f"No test set for {', '.join(built_in)}: measured on the load test's built-in texts.", ""]
    return [title, "", *table(header, rows), "", *(note if built_in else [])]


def _latencies(cell: dict[str, Any]) -> str:
    return f"{cell['p50_ms']['median']:.1f}/{cell['p99_ms']['median']:.1f}"


def _serving(section: dict[str, Any]) -> list[str]:
    lines = ["## 3–4. Serving `sentiment` end to end over gRPC (throughput req/s, p50/p99 ms)", ""]
    for tool in ("perf_analyzer", "async_client"):
        names = list(section["points"][0][tool])
        rows = []
        for point in section["points"]:
            cells = point[tool]
            rows.append(
                [str(point["concurrency"])]
                + [f"{cell(cells[n]['throughput'])} ({_latencies(cells[n])})" for n in names]
            )
        lines += [f"**{tool}**", "", *table(["concurrency", *names], rows), ""]
    if section.get("texts_source") == data.BUILT_IN:
        lines += ["No sentiment test split: requests are the load test's built-in reviews.", ""]
    overhead = section["overhead_c1"]
    lines += [
        f"Triton overhead at concurrency {overhead['concurrency']}: end-to-end p50 {overhead['e2e_p50_ms']:.2f} ms "
        f"(perf_analyzer, {section['reference']}) − raw ORT p50 {overhead['ort_p50_ms']:.2f} ms "
        f"= **{overhead['overhead_ms']:.2f} ms** "
        f"(tokenizer + ORT p50: {section['raw_ort']['tokenize_ort_p50_ms']:.2f} ms).",
        "",
    ]
    return lines + _where_the_time_goes(section)


def _where_the_time_goes(section: dict[str, Any]) -> list[str]:
    """The cores each process used at the top concurrency, and the raw encoder on the same texts."""
    share, raw = section.get("cpu_share"), section.get("raw_ort_batches")
    if not share or not raw:
        return []
    names = [name for name in share if name != "concurrency"]
    kinds = sorted({kind for name in names for kind in share[name]["cores"]})
    rows = []
    for name in names:
        cores = share[name]["cores"]
        used = [cores[k]["median"] if k in cores else 0.0 for k in kinds]
        rows.append([name, cell(share[name]["throughput"])] + [f"{c:.2f}" for c in used] + [f"{sum(used):.2f}"])
    raw_cells = ", ".join(f"{cell(summary)} ({name})" for name, summary in raw.items())
    return [
        f"**Where the time goes at c={share['concurrency']}** (perf_analyzer; cores = CPU seconds of each process "
        "per wall second, medians)",
        "",
        *table(["variant", "req/s", *kinds, "total"], rows),
        "",
        f"Raw ORT on the same texts in batches of 32, tokenized and grouped by length as the front model does "
        f"(texts/s): {raw_cells}.",
        "",
    ]


def _ceiling(section: dict[str, Any]) -> list[str]:
    lines = [
        "## 5. Ceiling",
        "",
        f"fp32 matmul ({section['matmul_size']}², {section['threads']} threads, torch and numpy, at the start and "
        f"the end of the run): ceiling (best run) {section['matmul_gflops']['max']:.1f} GFLOP/s, "
        f"all runs {cell(section['matmul_gflops'], 1)}. FLOPs per sequence: "
        + ", ".join(f"seq {k}: {v / 1e6:.1f} MFLOP" for k, v in section["flops_per_sequence"].items())
        + ".",
        "",
    ]
    rows = [
        [
            str(f["batch"]),
            str(f["sequence"]),
            "fp32 variants" if f["kind"] == "fp32" else "all (int8: fp32-equivalent)",
            f["best_variant"],
            f"{f['sequences_per_s']:.0f}",
            f"{f['achieved_gflops']:.1f}",
            f"{f['fraction_of_ceiling'] * 100:.1f}%",
        ]  # fmt: skip
        for f in section.get("fractions", [])
    ]
    if rows:
        lines += [*table(["batch", "seq", "among", "best variant", "seq/s", "GFLOP/s", "of ceiling"], rows), ""]
    return lines


def _checks(checks: list[dict[str, Any]]) -> list[str]:
    rows = [
        [
            c["name"],
            f"{c['value']:.2f}",
            ("≥ " if c["higher_is_better"] else "≤ ") + f"{c['bar']}",
            "met" if c["met"] else "**missed**",
        ]  # fmt: skip
        for c in checks
    ]
    return ["## Bars", "", *table(["figure", "measured", "bar", ""], rows), ""]


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    machine = meta["machine"]
    lines = [
        f"# Benchmark run `{meta['name']}` ({meta['profile']['name']} mode)",
        "",
        f"- command: `{meta['command']}`",
        f"- started {meta['started']}, took {meta['seconds'] / 60:.1f} min",
        f"- machine: {machine.get('Model name', '?')}, {machine['cpus_usable']} usable CPUs, "
        f"torch {machine['torch']}, onnxruntime {machine['onnxruntime']}; CPU flags: "
        f"{', '.join(machine.get('cpu_flags', [])) or 'not recorded'}",
        f"- load average (1/5/15 min) at start {meta['load_start']}, at end {meta['load_end']}",
        f"- cells: median [min–max] over {meta['profile']['repetitions']} interleaved repetitions",
        *(f"- data: {line}" for line in meta.get("data", {}).get("missing", [])),
        "",
    ]
    sections = {
        "runtime": _runtime,
        "generation": _generation,
        "serving": _serving,
        "ceiling": _ceiling,
        "translation": translation_report.markdown,
        "documents": documents.markdown,
        "imported": imported.markdown,
        "llm": llm.markdown,
        "gateway": gateway.markdown,
    }
    for key, render in sections.items():
        if results.get(key):
            lines += render(results[key])
    if results.get("checks"):
        lines += _checks(results["checks"])
    return "\n".join(lines)
