"""`python -m export.import_hf PATH --task translate|summarize|sentiment --name NAME [--int8]`."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"[a-z][a-z0-9_]*")
BUILTIN = ("sentiment", "translate", "summarize")  # an import must not overwrite these
TASKS = {
    "translate": "a MarianMTModel folder (e.g. Helsinki-NLP/opus-mt-zh-en), or a decoder-only chat model's",
    "summarize": "a decoder-only chat model's folder",
    "sentiment": "a BertForSequenceClassification folder (bert-base-chinese, RoBERTa-wwm-ext or MacBERT fine-tunes)",
}
DECODER_ONLY = "Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM or MistralForCausalLM"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m export.import_hf",
        description=(
            "Import a local Hugging Face checkpoint folder (save_pretrained) as a task the server offers: ONNX "
            "graphs with fused attention, its tokenizer as a `tokenizers` file and a task definition. Then "
            "`make serve` serves NAME (and, for translate, NAME_stream)."
        ),
        epilog="\n".join(f"--task {task}: {what}" for task, what in TASKS.items())
        + f"\ndecoder-only chat models ({DECODER_ONLY}, e.g. Qwen/Qwen2.5-0.5B-Instruct): --task translate or "
        "summarize; the prompt is the task file's [prompt], rendered with the model's chat template; its task "
        "endpoints decode greedily or by beam search, its chat twin (OpenAI's API) samples as its generation config "
        "says",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", type=Path, help="the checkpoint folder (config.json, weights, tokenizer files)")
    parser.add_argument("--task", required=True, choices=sorted(TASKS), help="what the model does")
    parser.add_argument("--name", required=True, help="the endpoint's name: lower-case letters, digits and _")
    parser.add_argument("--int8", action="store_true", help="also write int8 graphs and serve them")
    parser.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints", help="default: %(default)s")
    parser.add_argument("--tasks-dir", type=Path, default=ROOT / "tasks", help="default: %(default)s")
    args = parser.parse_args(argv)
    if not NAME.fullmatch(args.name):
        parser.error(f"--name {args.name!r}: use lower-case letters, digits and _, starting with a letter")
    if not args.path.is_dir():
        parser.error(f"{args.path} is not a folder")
    if args.name in BUILTIN:
        parser.error(f"--name {args.name}: that is a built-in task; choose another name")
    started = time.monotonic()
    try:
        written = _run(args)
    except ValueError as err:
        print(f"error: {err}; nothing was written", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    print(f"imported {args.path} as {args.name} in {time.monotonic() - started:.0f} s; `make serve` serves it")
    return 0


def _run(args: argparse.Namespace) -> list[Path]:
    """The importer for the folder's architecture and the task; ValueError when they do not go together."""
    from export.import_hf.causal_lm import ARCHITECTURES

    model_type = _model_type(args.path)
    if model_type in ARCHITECTURES:
        if args.task == "sentiment":
            raise ValueError(
                f"config.model_type = {model_type!r}: a decoder-only model imports for translate or summarize"
            )
        from export.import_hf.decoder_only import import_causal_lm

        return import_causal_lm(args.path, args.name, args.task, args.checkpoints, args.tasks_dir, args.int8)
    if args.task == "summarize":
        raise ValueError(f"config.model_type = {model_type!r}: --task summarize imports {DECODER_ONLY}")
    if args.task == "translate":
        if model_type not in ("marian", ""):
            raise ValueError(
                f"config.model_type = {model_type!r} is not supported: --task translate imports MarianMTModel "
                f"('marian') or a decoder-only chat model ({DECODER_ONLY})"
            )
        from export.import_hf.translation import import_translator as run
    else:
        from export.import_hf.bert import import_classifier as run
    return run(args.path, args.name, args.checkpoints, args.tasks_dir, args.int8)


def _model_type(folder: Path) -> str:
    """config.json's model_type ("" when it cannot be read: the importer then names the missing file)."""
    try:
        return str(json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type", ""))
    except (OSError, ValueError):
        return ""


if __name__ == "__main__":
    raise SystemExit(main())
