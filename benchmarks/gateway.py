"""`gateway`: what the gateway (serving/gateway) costs, against the same requests straight over gRPC.

The real Triton and the real gateway beside it, as `make serve` runs them. For each case, closed-loop clients
(benchmarks/load.py `drive`) send the same test texts either straight to Triton with the SDK's `AsyncClient`
over gRPC, or to the gateway over HTTP with aiohttp (keep-alive, what an app's HTTP client does):

- `translate`, one Tatoeba test sentence per request, the server's default settings (4 beams): DeepL's
  ``POST /v2/translate`` (what Mastodon, Weblate and DeepL's clients send) against ``client.translate``;
- `sentiment`, one review per request: ``POST /v1/sentiment`` against ``client.sentiment`` (the cheapest
  model: the gateway's share is largest here).

At 1 client (latency) one client alternates the two paths text by text (which goes first alternates too), so
both sides see the same texts in the same seconds: a translation's p50 drifts by more than the bar between two
windows a minute apart. At 32 clients (throughput) the two sides run in interleaved windows. On 2 cores the
gateway's process competes with Triton for the same cores, so the throughput ratio includes its CPU. The bars:
p50 at one client at most +2 ms over straight gRPC, throughput at 32 clients ≥ 0.9×; each the median over the
profile's repetitions.

    python -m benchmarks --sections gateway --name gateway   # → benchmarks/results/gateway.json, .md
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.closed_loop import start_server
from benchmarks.load import WARMUP_S, drive, figures
from benchmarks.profiles import ROOT, Profile
from benchmarks.serving import request_texts
from benchmarks.stats import interleaved, summarize_runs
from benchmarks.translation import cpu_info, test_sentences

CLIENTS = (1, 32)
P50_BAR_MS = 2.0
THROUGHPUT_BAR = 0.9
MODELS = ["translate", "sentiment", "sentiment_encoder"]
CASES = {  # case -> (task, gateway route, body for one text)
    "translate": ("translate", "/v2/translate", lambda text: {"text": [text], "target_lang": "EN-US"}),
    "sentiment": ("sentiment", "/v1/sentiment", lambda text: {"texts": [text]}),
}


async def _direct(grpc_url: str, task: str, texts: list[str], clients: int, seconds: float) -> dict:
    from clients import AsyncClient

    async with AsyncClient(grpc_url, protocol="grpc", retry=None) as client:
        return await drive(lambda text: client.infer(task, [text]), texts, clients, seconds)


async def _gateway(url: str, body: Any, texts: list[str], clients: int, seconds: float) -> dict:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        return await drive(partial(_post, session, url, body), texts, clients, seconds)


async def _post(session: Any, url: str, body: Any, text: str) -> Any:
    async with session.post(url, json=body(text)) as response:
        response.raise_for_status()
        return await response.json()


async def _alternating(
    grpc_url: str, task: str, url: str, body: Any, texts: list[str], seconds: float, warmup_s: float = WARMUP_S
) -> dict[str, dict]:
    """One client, each text sent both ways back to back (the first way alternating); each way's figures."""
    import aiohttp

    from clients import AsyncClient

    async with AsyncClient(grpc_url, protocol="grpc", retry=None) as client, aiohttp.ClientSession() as session:
        ways = {"grpc": lambda text: client.infer(task, [text]), "gateway": partial(_post, session, url, body)}
        latencies: dict[str, list[float]] = {way: [] for way in ways}
        errors = dict.fromkeys(ways, 0)
        start = time.perf_counter()
        for i, text in enumerate(itertools.cycle(texts)):
            if (sent := time.perf_counter()) >= start + warmup_s + seconds:
                break
            for way in list(ways)[:: 1 if i % 2 else -1]:
                began = time.perf_counter()
                try:
                    await ways[way](text)
                except Exception:  # noqa: BLE001  (counted and reported: a benchmark must not die on one failure)
                    errors[way] += 1
                    continue
                if sent >= start + warmup_s:
                    latencies[way].append(time.perf_counter() - began)
    if not all(latencies.values()):
        raise RuntimeError(f"a path answered nothing ({errors} errors)")
    # the rate is one client's on that path alone: answers over the time spent waiting for them
    return {way: figures(latencies[way], errors[way], sum(latencies[way])) for way in ways}


def _point(task: str, side: str, clients: int, runs: list[dict]) -> dict[str, Any]:
    return {"task": task, "side": side, "clients": clients, **summarize_runs(runs)}


def measure(profile: Profile, workdir: Path) -> dict[str, Any]:
    from serving.launcher.embedded import free_ports
    from serving.launcher.gateway import Gateway, GatewayOptions

    sentences, sentence_source = test_sentences(profile)
    reviews, review_source = request_texts(profile)
    texts = {"translate": sentences[:200], "sentiment": reviews}
    seconds = profile.client_seconds
    points: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        server = start_server(stack, ROOT / "model_repository", MODELS)
        [port] = free_ports(1)
        gateway = stack.enter_context(Gateway(GatewayOptions(triton_grpc=server.grpc_url, port=port)))
        for case, (task, route, body) in CASES.items():
            for clients in CLIENTS:
                if clients == 1:
                    pairs = partial(
                        _alternating, server.grpc_url, task, gateway.url + route, body, texts[case], seconds
                    )
                    both = [asyncio.run(pairs()) for _ in tqdm(range(profile.repetitions), desc=f"gateway {case} c=1")]
                    runs = {way: [run[way] for run in both] for way in ("grpc", "gateway")}
                else:
                    direct = partial(_direct, server.grpc_url, task, texts[case], clients, seconds)
                    through = partial(_gateway, gateway.url + route, body, texts[case], clients, seconds)
                    runs = interleaved(
                        {"grpc": lambda r=direct: asyncio.run(r()), "gateway": lambda r=through: asyncio.run(r())},
                        profile.repetitions,
                        desc=f"gateway {case} c={clients}",
                    )
                points += [_point(case, "straight over gRPC", clients, runs["grpc"])]
                points += [_point(case, f"gateway {route}", clients, runs["gateway"])]
                points[-1]["paired"] = _paired(runs["gateway"], runs["grpc"])
    section = {
        "texts": {"translate": sentence_source, "sentiment": review_source},
        "window_s": seconds,
        "repetitions": profile.repetitions,
        "cpu": cpu_info(),
        "points": points,
    }
    section["bars"] = bars(section)
    return section


def _paired(gateway: list[dict], direct: list[dict]) -> dict[str, float]:
    """Per repetition, gateway against the run beside it: p50 difference (ms) and throughput ratio; medians."""
    return {
        "p50_delta_ms": statistics.median(g["p50_ms"] - d["p50_ms"] for g, d in zip(gateway, direct)),
        "throughput_ratio": statistics.median(g["throughput"] / d["throughput"] for g, d in zip(gateway, direct)),
    }


def bars(section: dict[str, Any]) -> list[dict[str, Any]]:
    from benchmarks.summary import bar

    out = []
    for point in section["points"]:
        if "paired" not in point:
            continue
        if point["clients"] == 1:
            delta = point["paired"]["p50_delta_ms"]
            out.append(bar(f"gateway {point['task']}: p50 at 1 client, ms over straight gRPC", delta, P50_BAR_MS,
                           higher_is_better=False))  # fmt: skip
        else:
            ratio = point["paired"]["throughput_ratio"]
            out.append(bar(f"gateway {point['task']}: throughput at {point['clients']} clients ≥ "
                           f"{THROUGHPUT_BAR}× straight gRPC", ratio, THROUGHPUT_BAR))  # fmt: skip
    return out


def markdown(section: dict[str, Any]) -> list[str]:
    cpu = section["cpu"]
    lines = [
        "## Gateway (DeepL / JSON over HTTP) against straight gRPC",
        "",
        f"Closed-loop clients, {section['window_s']:g} s windows, {section['repetitions']} repetitions (median, "
        f"[min–max]); at 1 client one client alternates the two paths text by text, at 32 the two paths run in "
        f"interleaved windows; translate: {section['texts']['translate']}, default settings (4 beams); sentiment: "
        f"{section['texts']['sentiment']}. CPU flags: {', '.join(cpu.get('flags', [])) or 'not recorded'}.",
        "",
        "| task | path | clients | requests/s | p50 ms | p99 ms | gateway − gRPC p50 | gateway ÷ gRPC |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in section["points"]:
        paired = p.get("paired")
        lines.append(
            f"| {p['task']} | {p['side']} | {p['clients']} | {_cell(p['throughput'], 1)} | {_cell(p['p50_ms'], 2)} | "
            f"{_cell(p['p99_ms'], 1)} | {'' if not paired else format(paired['p50_delta_ms'], '+.2f') + ' ms'} | "
            f"{'' if not paired else format(paired['throughput_ratio'], '.2f') + '×'} |"
        )
    return [*lines, ""]


def _cell(summary: dict[str, float], digits: int) -> str:
    return f"{summary['median']:.{digits}f} [{summary['min']:.{digits}f}–{summary['max']:.{digits}f}]"
