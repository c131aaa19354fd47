"""The bars the issue sets, evaluated on a results dict. A missing section, shape or figure yields no check."""

from __future__ import annotations

from typing import Any

from benchmarks import generation, runtime, serving, threads


def _median(summary: dict[str, Any], key: str | None = None) -> float:
    return (summary[key] if key else summary)["median"]


def _best(summaries: dict[str, Any], name: str) -> float:
    """The median of a variant at its better thread count (see :mod:`benchmarks.threads`)."""
    return threads.best({n: s["median"] for n, s in summaries.items()}, name)[1]


def _runtime_checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    section = results.get("runtime")
    shape = next((s for s in (section or {}).get("shapes", []) if s["batch"] == 8 and s["sequence"] == 128), None)
    if shape is None:
        return []
    rates = shape["sequences_per_s"]
    out = [
        check(
            "ORT fused / PyTorch eager, batch 8 seq 128",
            _best(rates, runtime.FUSED) / _best(rates, runtime.EAGER),
            1.5,
        ),
        check("ORT int8 / ORT fused, batch 8 seq 128", _best(rates, runtime.INT8) / _best(rates, runtime.FUSED), 1.3),
    ]
    accuracy = section["accuracy"]
    if "not_measured" not in accuracy:
        drop = (accuracy[runtime.FUSED] - accuracy[runtime.INT8]) * 100
        out.append(check("int8 accuracy drop vs fused (points)", drop, 1.0, higher_is_better=False))
    return out


def _generation_checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [row for row in (results.get("generation") or {}).get("rows", []) if row["batch"] == 8]
    out = []
    for row in rows:
        rates = row["sentences_per_s"]
        value = _best(rates, generation.OP_GREEDY) / _best(rates, generation.EAGER)
        out.append(check(f"{row['task']}: BeamSearch-op greedy / eager greedy loop, batch 8", value, 2.0))
    return out


def _serving_checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    section = results.get("serving")
    if not section:
        return []
    top = max(section["points"], key=lambda p: p["concurrency"])
    c = top["concurrency"]
    pa = top["perf_analyzer"]
    client = top["async_client"]
    first = min(section["points"], key=lambda p: p["concurrency"])["concurrency"]
    out = []
    for instances in (1, 2):
        on, off = pa[f"batching_{instances}inst"], pa[f"no_batching_{instances}inst"]
        out += [
            check(
                f"dynamic batching / none, throughput at c={c} (perf_analyzer, {instances} instance(s))",
                _median(on, "throughput") / _median(off, "throughput"),
                1.5,
            ),
            check(
                f"dynamic batching p99 / none p99 at c={c} (perf_analyzer, {instances} instance(s))",
                _median(on, "p99_ms") / _median(off, "p99_ms"),
                1.0,
                higher_is_better=False,
            ),
        ]
    return out + [
        check(
            f"Triton / FastAPI+PyTorch throughput at c={c} (async client)",
            _median(client[serving.REFERENCE], "throughput") / _median(client[serving.FASTAPI], "throughput"),
            2.0,
        ),
        check(
            f"Triton overhead at c={first}: e2e p50 − raw ORT p50 (ms)",
            section["overhead_c1"]["overhead_ms"],
            1.5,
            higher_is_better=False,
        ),
    ]


def _served_share_checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Served `sentiment` at the top concurrency against its encoder alone in ORT, both from this run: at batch
    32 × 32 tokens (the fused graph's better thread count), and on the served texts in batches of 32 (tokenized
    and grouped by length as the front model does): how much of the raw rate survives the serving path."""
    section = results.get("serving")
    if not section:
        return []
    top = max(section["points"], key=lambda p: p["concurrency"])
    served = _median(top["perf_analyzer"][serving.REFERENCE], "throughput")
    where = f"served sentiment at c={top['concurrency']} (perf_analyzer) / raw ORT"
    out = []
    shapes = (results.get("runtime") or {}).get("shapes", [])
    raw = next((s for s in shapes if s["batch"] == 32 and s["sequence"] == 32), None)
    if raw is not None:
        out.append(check(f"{where} fused, batch 32 seq 32", served / _best(raw["sequences_per_s"], runtime.FUSED), 0.6))
    same_texts = section.get("raw_ort_batches")
    if same_texts:
        best = max(summary["median"] for summary in same_texts.values())
        out.append(check(f"{where} on the same texts, batches of {serving.RAW_BATCH}", served / best, 0.6))
    return out


def check(name: str, value: float, bar: float, higher_is_better: bool = True) -> dict[str, Any]:
    met = value >= bar if higher_is_better else value <= bar
    return {"name": name, "value": value, "bar": bar, "higher_is_better": higher_is_better, "met": met}


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    return (
        _runtime_checks(results)
        + _generation_checks(results)
        + _serving_checks(results)
        + _served_share_checks(results)
    )
