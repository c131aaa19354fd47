"""What N engine processes of one imported model hold in memory: each loads the checkpoint's step graphs as a
front model does (serving/engine: `in_process_session`), decodes a few prompts, and reports its resident set,
its proportional share (PSS: shared pages split between the processes that map them) and its anonymous memory
(what no other process can share), from /proc/self/smaps_rollup. `--no-prepack` turns off ONNX Runtime's weight
prepacking (`session.disable_prepacking`): the weights then stay in the external-data file's mapping, which the
processes share, instead of each packing its own copy.

    python -m benchmarks.graph_memory checkpoints/NAME --processes 2 [--no-prepack] [--precision int8]

The processes start together and decode at the same time, so with more processes than cores the decode time
counts the sharing of the CPU too: compare decode times of one process, and memory of several.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import time
from pathlib import Path
from typing import Any

PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 4, 40, 16


def rollup() -> dict[str, float]:
    """/proc/self/smaps_rollup's fields in MB."""
    fields = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":")[0], line.split()[1]
        fields[name] = int(value) / 1024
    return fields


def worker(folder: str, precision: str, prepack: bool, results: Any, done: Any) -> None:
    import serving.providers as providers
    from serving.engine.engine import Engine, Job

    if not prepack:
        session = providers.inference_session

        def unpacked(path: Any, options: Any) -> Any:
            options.add_session_config_entry("session.disable_prepacking", "1")
            return session(path, options)

        providers.inference_session = unpacked  # type: ignore[assignment]
    started = time.perf_counter()
    engine = Engine.load(Path(folder), precision, threads=2)
    loaded = time.perf_counter() - started
    sources = [[100 + i + j for j in range(PROMPT_TOKENS)] for i in range(PROMPTS)]
    started = time.perf_counter()
    for source in sources:
        engine.submit(Job(source, NEW_TOKENS, 1, lambda tokens, finish: None))
    engine.run_until_idle()
    decoded = time.perf_counter() - started
    memory = rollup()
    results.put({"load_s": loaded, "decode_s": decoded, "rss": memory["Rss"], "pss": memory["Pss"],
                 "anonymous": memory["Anonymous"]})  # fmt: skip
    done.wait()  # every process still holds its memory while the others measure theirs


def measure(folder: Path, processes: int, precision: str, prepack: bool) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    results, done = context.Queue(), context.Event()
    workers = [
        context.Process(target=worker, args=(str(folder), precision, prepack, results, done)) for _ in range(processes)
    ]
    for process in workers:
        process.start()
    measured = [results.get() for _ in workers]
    done.set()
    for process in workers:
        process.join()
    return {
        "checkpoint": str(folder),
        "precision": precision,
        "prepack": prepack,
        "processes": processes,
        "cpu": platform.processor() or platform.machine(),
        "pss_mb_total": round(sum(m["pss"] for m in measured)),
        "rss_mb": [round(m["rss"]) for m in measured],
        "anonymous_mb": [round(m["anonymous"]) for m in measured],
        "load_s": [round(m["load_s"], 1) for m in measured],
        "decode_s": [round(m["decode_s"], 2) for m in measured],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.graph_memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("checkpoint", type=Path, help="a checkpoint folder (checkpoints/NAME) with its step graphs")
    parser.add_argument("--processes", type=int, default=1, help="engine processes at once (default 1)")
    parser.add_argument("--precision", choices=("fp32", "int8"), default="fp32")
    parser.add_argument("--no-prepack", action="store_true", help="session.disable_prepacking in every session")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.checkpoint, args.processes, args.precision, not args.no_prepack)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
