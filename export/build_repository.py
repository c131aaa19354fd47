"""Build the Triton model repository from the committed checkpoints.

`python -m export.build_repository` exports each checkpoint to ONNX
(`sentiment_encoder`, `translate_generator`, `summarize_generator`, and the explain models
`sentiment_attention`, `translate_attention` under
`model_repository/<model>/1/model.onnx`) and copies the tokenizers and task config next to the
front model. A stamp file records the checkpoint hashes, so an unchanged checkpoint is
not exported again (`--force` rebuilds).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAMP = ".built.json"


def fingerprint(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name != "metrics.json":
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def copy_assets(checkpoint: Path, front: Path, names: list[str]) -> list[Path]:
    """Tokenizer and task config go next to the front model's model.py (read in initialize())."""
    front.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy2(checkpoint / name, front / name)
    return [front / name for name in names]


def build_sentiment(checkpoint: Path, repository: Path) -> list[Path]:
    from export import sentiment
    from export.onnx_export import export_encoder_classifier

    model, _, _ = sentiment.load(checkpoint)
    onnx_path = export_encoder_classifier(model, repository / ONNX_MODEL["sentiment"] / "1" / "model.onnx")
    return [onnx_path, *copy_assets(checkpoint, repository / "sentiment" / "1", ["tokenizer.json", "config.json"])]


def build_seq2seq(task: str) -> Callable[[Path, Path], list[Path]]:
    def builder(checkpoint: Path, repository: Path) -> list[Path]:
        from export import seq2seq
        from export.generation import Decoding
        from export.seq2seq_export import export_generator

        model, config, _, _ = seq2seq.load(checkpoint)
        onnx_path = export_generator(
            model,
            repository / ONNX_MODEL[task] / "1" / "model.onnx",
            max_len=config["max_new_tokens_limit"] + 1,
            **asdict(Decoding.from_config(config)),
        )
        assets = ["tokenizer.json", "target_tokenizer.json", "config.json"]
        return [onnx_path, *copy_assets(checkpoint, repository / task / "1", assets)]

    return builder


def build_explain(task: str) -> Callable[[Path, Path], list[Path]]:
    """`<task>_explain`: the attention-returning ONNX model (export/explain_export.py) and the task's assets."""

    def builder(checkpoint: Path, repository: Path) -> list[Path]:
        from export.explain_export import export_explainer

        front = f"{task}_explain"
        onnx_path = export_explainer(task, checkpoint, repository / ONNX_MODEL[front] / "1" / "model.onnx")
        assets = [n for n in ("tokenizer.json", "target_tokenizer.json", "config.json") if (checkpoint / n).exists()]
        return [onnx_path, *copy_assets(checkpoint, repository / front / "1", assets)]

    return builder


# public front model → the ONNX model it calls
ONNX_MODEL = {"sentiment": "sentiment_encoder", "translate": "translate_generator", "summarize": "summarize_generator"}
ONNX_MODEL |= {"sentiment_explain": "sentiment_attention", "translate_explain": "translate_attention"}
CHECKPOINT = {"sentiment_explain": "sentiment", "translate_explain": "translate"}  # front model → checkpoint folder
BUILDERS = {
    "sentiment": build_sentiment,
    "translate": build_seq2seq("translate"),
    "summarize": build_seq2seq("summarize"),
    "sentiment_explain": build_explain("sentiment"),
    "translate_explain": build_explain("translate"),
}


def build(checkpoints: Path, repository: Path, tasks: list[str] | None = None, force: bool = False) -> list[str]:
    """Export every task whose checkpoint exists; returns the tasks that were (re)built."""
    stamp_path = repository / STAMP
    stamp = json.loads(stamp_path.read_text()) if stamp_path.exists() else {}
    built = []
    for task, builder in BUILDERS.items():
        if tasks and task not in tasks:
            continue
        folder = checkpoints / CHECKPOINT.get(task, task)
        if not (folder / "model.safetensors").exists():
            print(f"skip {task}: no checkpoint at {folder}")
            continue
        fp = fingerprint(folder)
        outputs_exist = (repository / ONNX_MODEL[task] / "1" / "model.onnx").exists()
        if not force and stamp.get(task) == fp and outputs_exist:
            print(f"{task}: up to date")
            continue
        t0 = time.monotonic()
        print(f"{task}: exporting {folder} → ONNX ...", flush=True)
        paths = builder(folder, repository)
        print(
            f"{task}: wrote {', '.join(str(p.relative_to(repository)) for p in paths)} in {time.monotonic() - t0:.1f}s"
        )
        stamp[task] = fp
        built.append(task)
    stamp_path.write_text(json.dumps(stamp, indent=2) + "\n")
    return built


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m export.build_repository", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints", help="default: %(default)s")
    p.add_argument("--repository", type=Path, default=ROOT / "model_repository", help="default: %(default)s")
    p.add_argument("--task", action="append", choices=sorted(BUILDERS), help="only these tasks (repeatable)")
    p.add_argument("--force", action="store_true", help="export even when the checkpoint is unchanged")
    args = p.parse_args(argv)
    build(args.checkpoints, args.repository, args.task, args.force)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
