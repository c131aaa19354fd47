"""fp32 against int8 step graphs on the continuous-batching engine: quality on the test sets, offline tokens/s.

The step graphs of the shipped translate and summarize checkpoints are exported into a temporary folder and
quantized there (export/graphs/step_export.py: `quantize_step_graphs`, MatMul weights int8, RoPE path float). For each
precision the engine runs offline, in this thread, with every test source submitted at once:

- translate: the Tatoeba zh→en test pairs, greedy and beam 4, 48 new tokens, BLEU and chrF (export.training.scores
  `bleu_chrf`, as in the checkpoint's metrics.json);
- summarize: the test split (or its first --summarize-limit texts), greedy and beam 4, 40 new tokens, ROUGE
  (`rouge_chars`).

Then tokens/s at --threads intra-op threads (default 1) on the first --speed-sources translate sources, fp32 and
int8 interleaved, best of --repeats: a quick number, contended when others use the CPU. The bar: int8's BLEU,
chrF and ROUGE-L within 0.3 points of fp32. Prints a JSON summary and writes it to --out.

    python -m benchmarks.engine_int8 --out benchmarks/results/engine_int8.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import onnxruntime as ort

from export.graphs.step_export import export_step_graphs, quantize_graph
from export.training import seq2seq
from serving.engine.config import EngineConfig
from serving.engine.engine import Engine, Job
from serving.text.tokenizer import detokenize

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT.parent / "shared" / "data"
OUT = ROOT / "benchmarks" / "results" / "engine_int8.json"
BAR_POINTS = 0.3  # int8 may lose at most this much of any headline score
SEARCHES = (("greedy", 1), ("beam4", 4))
HEADLINES = {"translate": ("bleu", "chrf"), "summarize": ("rougeL",)}


class Checkpoint:
    """A seq2seq checkpoint, its test sources and references, and its step graphs in fp32 and int8."""

    def __init__(self, name: str, checkpoints: Path, data_dir: Path, folder: Path, limit: int | None, **quant):
        self.name = name
        self.model, config, src_tok, self.target = seq2seq.load(checkpoints / name)
        self.spec = seq2seq.TASKS[name]
        pairs = self.spec.reader(data_dir)[1][:limit]
        self.sources = [s for s, _ in seq2seq.encode_pairs(pairs, src_tok, self.target, self.spec)]
        self.references = [p.target for p in pairs]
        self.reference = config_scores(checkpoints / name) if limit is None else None
        self.config = EngineConfig.from_dict(config)
        fp32 = export_step_graphs(self.model, folder / name)
        int8 = tuple(path.with_name(path.stem + ".int8.onnx") for path in fp32)
        self.excluded = [quantize_graph(src, dst, **quant) for src, dst in zip(fp32, int8)]
        self.graphs = {"fp32": fp32, "int8": int8}

    def engine(self, precision: str, threads: int) -> Engine:
        return Engine(*self.graphs[precision], self.config, threads=threads)

    def decode(self, engine: Engine, beams: int, sources: list[list[int]] | None = None) -> list[list[int]]:
        sources = self.sources if sources is None else sources
        out: list[list[int]] = [[] for _ in sources]

        def keep(i: int):
            return lambda tokens, final: out[i].extend(tokens)

        for i, source in enumerate(sources):
            engine.submit(Job(source, self.spec.max_target_tokens, beams, keep(i)))
        engine.run_until_idle()
        return out

    def score(self, tokens: list[list[int]]) -> dict[str, float]:
        return self.spec.score([detokenize(self.target, t) for t in tokens], self.references)


def config_scores(checkpoint: Path) -> dict | None:
    """The PyTorch reference's test scores recorded at training (metrics.json), for context."""
    path = checkpoint / "metrics.json"
    if not path.is_file():
        return None
    test = json.loads(path.read_text())["test"]
    return {label: {k: v for k, v in test[label].items() if k != "seconds"} for label, _ in SEARCHES if label in test}


def quality(task: Checkpoint, threads: int) -> dict:
    results: dict = {"sources": len(task.sources)}
    for label, beams in SEARCHES:
        tokens, row = {}, {}
        for precision in ("fp32", "int8"):
            engine = task.engine(precision, threads)
            t0 = time.perf_counter()
            tokens[precision] = task.decode(engine, beams)
            seconds = time.perf_counter() - t0
            row[precision] = {**task.score(tokens[precision]), "seconds": round(seconds, 1)}
        row["delta"] = {k: round(row["int8"][k] - row["fp32"][k], 2) for k in row["fp32"] if k != "seconds"}
        same = sum(a == b for a, b in zip(tokens["fp32"], tokens["int8"]))
        row["identical_outputs"] = round(same / len(task.sources), 3)
        results[label] = row
    if task.reference:
        results["pytorch_reference"] = task.reference
    return results


def speed(task: Checkpoint, threads: int, sources: int, repeats: int) -> dict:
    """Generated tokens per second of the engine, fp32 and int8 interleaved, best of `repeats` each."""
    subset = task.sources[:sources]
    out: dict = {"sources": len(subset), "threads": threads, "repeats": repeats}
    for label, beams in SEARCHES:
        engines = {precision: task.engine(precision, threads) for precision in ("fp32", "int8")}
        best = dict.fromkeys(engines, 0.0)
        for _ in range(repeats):
            for precision, engine in engines.items():
                before = engine.stats.generated_tokens
                t0 = time.perf_counter()
                task.decode(engine, beams, subset)
                rate = (engine.stats.generated_tokens - before) / (time.perf_counter() - t0)
                best[precision] = max(best[precision], rate)
        out[label] = {
            "fp32_tokens_per_s": round(best["fp32"], 1),
            "int8_tokens_per_s": round(best["int8"], 1),
            "int8_speedup": round(best["int8"] / best["fp32"], 2),
        }
    return out


def verdict(results: dict) -> dict:
    """The largest loss of any headline score, and whether it stays within the bar."""
    drops = {
        f"{task}.{label}.{metric}": -results[task][label]["delta"][metric]
        for task, metrics in HEADLINES.items()
        if task in results
        for label, _ in SEARCHES
        for metric in metrics
    }
    worst = max(drops, key=drops.get)
    return {
        "max_drop_points": BAR_POINTS,
        "worst": worst,
        "worst_drop": round(drops[worst], 2) + 0.0,
        "met": drops[worst] <= BAR_POINTS,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.engine_int8",
        description=__doc__.split("\n\n")[0],
        epilog="The tokens/s figures are labelled contended: other work may share the CPU.",
    )
    p.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints", help="default: %(default)s")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR, help="default: %(default)s")
    p.add_argument("--task", action="append", choices=sorted(HEADLINES), help="only these tasks (repeatable)")
    p.add_argument("--summarize-limit", type=int, default=None, help="first N summarize test texts (default: all)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of every engine (default: %(default)s)")
    p.add_argument("--speed-sources", type=int, default=300, help="translate sources timed (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per precision (default: %(default)s)")
    p.add_argument("--per-channel", action="store_true", help="quantize weights per output channel")
    p.add_argument("--keep-fp32", action="append", default=[], help="a node name to leave float (repeatable)")
    p.add_argument("--out", type=Path, default=None, help=f"write the JSON here too (e.g. {OUT.relative_to(ROOT)})")
    args = p.parse_args(argv)

    quant = {"per_channel": args.per_channel, "keep_fp32": args.keep_fp32}
    results: dict = {
        "meta": {
            "command": "python -m benchmarks.engine_int8 " + " ".join(argv if argv is not None else sys.argv[1:]),
            "quantization": {"weights": "QInt8", "op_types": ["MatMul"], "rope_path": "float", **quant},
            "onnxruntime": ort.__version__,
            "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "speed_note": "contended: other processes share the CPU, tokens/s is indicative only",
        }
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.task or sorted(HEADLINES, reverse=True):  # translate first
            limit = args.summarize_limit if name == "summarize" else None
            task = Checkpoint(name, args.checkpoints, args.data_dir, Path(tmp), limit, **quant)
            results[name] = quality(task, args.threads)
            results[name]["excluded_nodes"] = dict(zip(("encoder", "decoder"), task.excluded))
            if name == "translate":
                results["speed"] = speed(task, args.threads, args.speed_sources, args.repeats)
            print(json.dumps({name: results[name]}), flush=True)
    results["bar"] = verdict(results)
    text = json.dumps(results, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
