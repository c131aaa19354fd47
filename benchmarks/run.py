"""`python -m benchmarks [--quick]`: every comparison in one run → results/<name>.json, .md and PNG plots."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import ceiling, checks, data, plots, report
from benchmarks.profiles import ROOT, SECTIONS, profile
from benchmarks.stats import load_average, machine
from export.training.data import DEFAULT_DATA_DIR

DEFAULT_OUT = ROOT / "benchmarks" / "results"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=textwrap.fill(
            "Measure every layer of ropeserve against its baseline on this machine, in one run: model runtime "
            "(PyTorch eager vs ORT decomposed/fused/int8), generation (eager greedy loop vs the BeamSearch op), "
            "serving (Triton with/without dynamic batching, 1 or 2 instances, via perf_analyzer and the async "
            "client; a FastAPI + PyTorch baseline), translation (the continuous-batching engine vs CTranslate2 "
            "offline and the previous served translate; streaming time to first piece), documents (paragraphs "
            "served as sentence rows vs CTranslate2 on the split sentences; fairness to single sentences) and the "
            "machine's matmul ceiling. Writes <out>/<name>.json, <name>.md and <name>_*.png. Needs "
            "`make repository` and `make perf-analyzer` (make bench does both); the translation and documents "
            "sections also need ctranslate2.",
            width=100,
        ),
        epilog=data.describe(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_const", const="quick", dest="mode", help="shorter runs (< 5 min)")
    mode.add_argument(
        "--smoke", action="store_const", const="smoke", dest="mode", help="a tiny run that only checks the harness"
    )
    parser.set_defaults(mode="full")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder (default: %(default)s)")
    parser.add_argument("--name", help="file name stem (default: the mode, e.g. 'full')")
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help="comma-separated subset of %(default)s",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help=f"datasets folder, read as listed below (default: {DEFAULT_DATA_DIR}; $ROPESERVE_DATA_DIR sets it)",
    )
    args = parser.parse_args(argv)
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    return args


def run_sections(sections: list[str], prof: Any, workdir: Path) -> dict[str, Any]:
    """Each comparison in turn (imports deferred: the serving one needs no torch model until it runs)."""
    from benchmarks import documents, gateway, generation, imported, llm, runtime, serving, translation

    measures = {
        "ceiling": lambda: ceiling.measure(prof),
        "runtime": lambda: runtime.measure(prof, workdir),
        "generation": lambda: generation.measure(prof),
        "serving": lambda: serving.measure(prof, workdir),
        "translation": lambda: translation.measure(prof, workdir),
        "documents": lambda: documents.measure(prof, workdir),
        "imported": lambda: imported.measure(prof, workdir),
        "llm": lambda: llm.measure(prof, workdir),
        "gateway": lambda: gateway.measure(prof, workdir),
    }
    results: dict[str, Any] = {}
    for section in SECTIONS:
        if section in sections:
            started = time.perf_counter()
            print(f"[bench] {section} …", file=sys.stderr, flush=True)
            results[section] = measures[section]()
            results[section]["seconds"] = time.perf_counter() - started
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prof = profile(args.mode, args.data_dir)
    name = args.name or args.mode
    sections = args.sections.split(",")
    missing = data.plan(prof.data_dir, sections)
    for line in missing:
        print(f"[bench] {line}", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    started, load_start = time.perf_counter(), load_average()
    meta: dict[str, Any] = {
        "name": name,
        "command": shlex.join(["python", "-m", "benchmarks", *(sys.argv[1:] if argv is None else argv)]),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "profile": prof.to_dict(),
        "machine": machine(),
        "load_start": load_start,
        "data": {"dir": str(prof.data_dir), "missing": missing},
    }
    with tempfile.TemporaryDirectory(prefix="ropeserve-bench-") as tmp:
        results: dict[str, Any] = run_sections(sections, prof, Path(tmp))
    if results.get("ceiling"):
        ceiling.finish(results["ceiling"], prof, results.get("runtime"))
    # the translation, documents, imported, llm and gateway sections compute their own bars; listed with the others
    results["checks"] = checks.evaluate(results) + [
        bar
        for section in ("translation", "documents", "imported", "llm", "gateway")
        for bar in (results.get(section) or {}).get("bars", [])
    ]
    meta |= {"load_end": load_average(), "seconds": time.perf_counter() - started}
    results = {"meta": meta, **results}
    json_path = args.out / f"{name}.json"
    json_path.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    md_path = args.out / f"{name}.md"
    md_path.write_text(report.markdown(results) + "\n", encoding="utf-8")
    pngs = plots.draw_all(results, args.out, name)
    print(f"[bench] wrote {json_path}, {md_path}" + "".join(f", {p}" for p in pngs), file=sys.stderr)
    for c in results["checks"]:
        print(f"[bench] {'met   ' if c['met'] else 'MISSED'} {c['name']}: {c['value']:.2f} (bar {c['bar']})")
    return 0
