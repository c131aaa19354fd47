"""What bounding the queue costs: `sentiment` under perf_analyzer with the committed bound (the front model's own
queue), with no bound, and with Triton's ``default_queue_policy`` as the bound instead, at 1 and 2 front instances.

Triton 2.51's dynamic batcher, once a model has a ``default_queue_policy``, can leave a request that arrives while
every instance is busy waiting out the scheduler's 500 ms idle wait; that is why the front models bound their queue
themselves (serving/frontends/waiting.py). For each variant a repository of its own (`sentiment` and its encoder,
the config rewritten), a fresh server, and perf_analyzer at each concurrency. The variants:

- ``committed``: as shipped (the front model's queue: at most 256 waiting requests, each for at most 1 s);
- ``unbounded``: the front model's queue without its limit and timeout;
- ``triton_policy``: unbounded in the front model, bounded by Triton's queue policy with the same limit and timeout
  (how the front models were bounded before).

    python -m benchmarks.queue_policy          # → benchmarks/results/queue_policy.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from benchmarks import perf_analyzer
from benchmarks.stats import machine
from benchmarks.variant_repository import UNBOUNDED_QUEUE
from loadtest.texts import load_texts
from serving.embedded import EmbeddedTriton, ServerOptions, free_ports
from tasks.definition import QUEUE_SIZE_PARAMETER, QUEUE_TIMEOUT_PARAMETER

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("sentiment", "sentiment_encoder")
VARIANTS = ("committed", "unbounded", "triton_policy")


def rewrite(text: str, variant: str, instances: int) -> str:
    """The front model's config.pbtxt with the variant's queue bound and ``instances`` instances."""
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    parameters = config.parameters
    if QUEUE_SIZE_PARAMETER not in parameters:
        raise SystemExit("the sentiment config has no queue parameters: nothing to compare")
    size, timeout_s = (
        int(parameters[QUEUE_SIZE_PARAMETER].string_value),
        float(parameters[QUEUE_TIMEOUT_PARAMETER].string_value),
    )
    if variant != "committed":
        for key, value in UNBOUNDED_QUEUE.items():
            parameters[key].string_value = value
    if variant == "triton_policy":
        policy = config.dynamic_batching.default_queue_policy
        policy.max_queue_size = size
        policy.timeout_action = model_config_pb2.ModelQueuePolicy.REJECT
        policy.default_timeout_microseconds = round(timeout_s * 1_000_000)
    del config.instance_group[:]
    config.instance_group.add(count=instances, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
    return text_format.MessageToString(config)


def repository(root: Path, variant: str, instances: int) -> Path:
    """A copy of the two models with the variant's queue bound and instance count."""
    repo = root / f"{variant}_{instances}"
    for model in MODELS:
        shutil.copytree(ROOT / "model_repository" / model, repo / model, symlinks=True)
    config = repo / "sentiment" / "config.pbtxt"
    config.write_text(rewrite(config.read_text(), variant, instances))
    return repo


def measure(variants: list[str], instances: list[int], concurrencies: list[int], window_ms: int) -> list[dict]:
    texts = load_texts(ROOT.parent / "shared" / "data")[0]["sentiment"][:300]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="queue-policy-") as tmp:
        data = perf_analyzer.write_input_data(texts, Path(tmp) / "input.json")
        for variant in variants:
            for count in instances:
                repo = repository(Path(tmp), variant, count)
                http, grpc, metrics = free_ports(3)
                options = ServerOptions(model_repository=repo, http_port=http, grpc_port=grpc, metrics_port=metrics)
                with EmbeddedTriton(options) as server:
                    for concurrency in concurrencies:
                        result = perf_analyzer.run(server.grpc_url, "sentiment", concurrency, data, window_ms)
                        rows.append({"variant": variant, "instances": count, "concurrency": concurrency, **result})
                        print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| variant | instances | concurrency | infer/s | p50 ms | p99 ms |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['instances']} | {r['concurrency']} | {r['throughput']:.0f} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.queue_policy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated (default: all)")
    parser.add_argument("--instances", default="1,2", help="front instance counts (default: 1,2)")
    parser.add_argument("--concurrency", default="1,8,32", help="perf_analyzer concurrencies (default: 1,8,32)")
    parser.add_argument("--window-ms", type=int, default=3000, help="perf_analyzer measurement window")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "queue_policy.json")
    args = parser.parse_args(argv)
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    rows = measure(
        args.variants.split(","),
        [int(n) for n in args.instances.split(",")],
        [int(c) for c in args.concurrency.split(",")],
        args.window_ms,
    )
    args.out.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2) + "\n")
    print(table(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
