"""PNG plots of one run: throughput vs concurrency, latency percentiles, speed-up per layer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402  (after the backend choice)


def throughput_vs_concurrency(serving: dict[str, Any], path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, tool in zip(axes, ("perf_analyzer", "async_client")):
        concurrencies = [p["concurrency"] for p in serving["points"]]
        for name in serving["points"][0][tool]:
            medians = [p[tool][name]["throughput"]["median"] for p in serving["points"]]
            lows = [p[tool][name]["throughput"]["min"] for p in serving["points"]]
            highs = [p[tool][name]["throughput"]["max"] for p in serving["points"]]
            ax.plot(concurrencies, medians, marker="o", label=name)
            ax.fill_between(concurrencies, lows, highs, alpha=0.15)
        ax.set_xscale("log", base=2)
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ax.set_xlabel("concurrency")
        ax.set_title(f"sentiment over gRPC ({tool})")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("requests/s (median, band = min–max)")
    axes[1].legend(fontsize=8)
    return _save(fig, path)


def latency_percentiles(serving: dict[str, Any], path: Path) -> Path:
    top = max(serving["points"], key=lambda p: p["concurrency"])
    cells = top["async_client"]
    names = list(cells)
    fig, ax = plt.subplots(figsize=(9, 4.2))
    width = 0.27
    for i, key in enumerate(("p50_ms", "p90_ms", "p99_ms")):
        ax.bar([x + i * width for x in range(len(names))], [cells[n][key]["median"] for n in names], width, label=key)
    ax.set_xticks([x + width for x in range(len(names))], names, rotation=15, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title(f"latency percentiles at concurrency {top['concurrency']} (async client)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def speedup_per_layer(checks: list[dict[str, Any]], path: Path) -> Path:
    ratios = [c for c in checks if c["higher_is_better"]]
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.55 * max(1, len(ratios))))
    ys = range(len(ratios))
    colors = ["tab:green" if c["met"] else "tab:red" for c in ratios]
    ax.barh(list(ys), [c["value"] for c in ratios], color=colors)
    for y, c in zip(ys, ratios):
        ax.plot([c["bar"], c["bar"]], [y - 0.4, y + 0.4], color="black", linewidth=2)
        ax.text(c["value"], y, f" {c['value']:.2f}×", va="center", fontsize=8)
    ax.set_yticks(list(ys), [c["name"] for c in ratios], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("speed-up (× baseline); black tick = the issue's bar")
    ax.set_title("speed-up per layer")
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_all(results: dict[str, Any], out_dir: Path, name: str) -> list[Path]:
    paths = []
    if results.get("serving"):
        paths.append(throughput_vs_concurrency(results["serving"], out_dir / f"{name}_throughput_vs_concurrency.png"))
        paths.append(latency_percentiles(results["serving"], out_dir / f"{name}_latency_percentiles.png"))
    if results.get("checks"):
        paths.append(speedup_per_layer(results["checks"], out_dir / f"{name}_speedup_per_layer.png"))
    return paths
