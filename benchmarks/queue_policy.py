"""What Triton 2.51's queue policy costs: `sentiment` under perf_analyzer with its committed queue bound, without
one, and with each half of it, at 1 and 2 front instances.

Triton 2.51's dynamic batcher, once a model has a ``default_queue_policy``, can leave a request that arrives while
every instance is busy waiting out the scheduler's 500 ms idle wait. This measures where that shows: for each
variant a repository of its own (`sentiment` and its encoder, the config rewritten), a fresh server, and
perf_analyzer at each concurrency (3 s windows, 3 of them). The variants:

- ``committed``: the shipped policy (at most 256 waiting requests, each for at most 1 s);
- ``none``: no policy (an unbounded queue);
- ``size_only`` / ``timeout_only``: each half of the policy alone;
- ``committed_delay_1ms``: the policy with a 1 ms ``max_queue_delay_microseconds`` (does a batching delay wake it?);
- ``committed_returned``: the shipped policy with answers returned from ``execute()`` even at one instance
  (``send_answers_after_execute`` false): what the front model's safeguard avoids.

    python -m benchmarks.queue_policy --variants committed,none   # → benchmarks/results/queue_policy.json

The committed run's bars (BENCHMARKS.md's summary): p99 at concurrency 32 with the committed policy within 1.5×
of no policy, at each instance count.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import perf_analyzer
from benchmarks.stats import machine
from loadtest.texts import load_texts
from serving.frontends.base import SEND_AFTER_EXECUTE
from serving.launcher.embedded import EmbeddedTriton, ServerOptions, free_ports

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("sentiment", "sentiment_encoder")
POLICY = re.compile(r"default_queue_policy \{[^}]*\}")
VARIANTS = {
    "committed": None,  # the config as generated from tasks/sentiment.toml
    "none": "",
    "size_only": "default_queue_policy {\n    max_queue_size: 256\n  }",
    "timeout_only": "default_queue_policy {\n    default_timeout_microseconds: 1000000\n  }",
    "committed_delay_1ms": r"\g<0>\n  max_queue_delay_microseconds: 1000",
    "committed_returned": None,
}
RETURNED = f'parameters {{\n  key: "{SEND_AFTER_EXECUTE}"\n  value {{\n    string_value: "false"\n  }}\n}}\n'


def repository(root: Path, variant: str, instances: int) -> Path:
    """A copy of the two models with the variant's policy and instance count."""
    repo = root / f"{variant}_{instances}"
    for model in MODELS:
        shutil.copytree(ROOT / "model_repository" / model, repo / model, symlinks=True)
    config = repo / "sentiment" / "config.pbtxt"
    text = config.read_text()
    if not POLICY.search(text):
        raise SystemExit(f"{config} has no default_queue_policy: nothing to compare")
    if VARIANTS[variant] is not None:
        text = POLICY.sub(VARIANTS[variant], text)
    text = re.sub(r"instance_group \{\s*count: \d+", f"instance_group {{\n  count: {instances}", text, count=1)
    if variant == "committed_returned":
        text += RETURNED
    config.write_text(text)
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
    started = datetime.now(UTC).isoformat(timespec="seconds")
    rows = measure(
        args.variants.split(","),
        [int(n) for n in args.instances.split(",")],
        [int(c) for c in args.concurrency.split(",")],
        args.window_ms,
    )
    command = shlex.join(["python", "-m", "benchmarks.queue_policy", *(sys.argv[1:] if argv is None else argv)])
    meta = {"command": command, "started": started, "machine": machine()}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(table(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
