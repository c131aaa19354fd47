"""Training CLI: `python -m export.train sentiment --data-dir ../shared/data --out checkpoints/sentiment`."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from export.data import DEFAULT_DATA_DIR
from export.model import ModelConfig
from export.training import TrainConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m export.train",
        description="Train a RoPE Transformer for one task on the public data and write a checkpoint folder "
        "(model.safetensors, config.json, tokenizer.json, metrics.json).",
    )
    p.add_argument("task", choices=["sentiment"], help="which model to train")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="public datasets root (default: %(default)s)")
    p.add_argument("--out", type=Path, help="checkpoint folder (default: checkpoints/<task>)")
    p.add_argument("--state", type=Path, help="resumable training state (default: runs/<task>/state.pt)")
    p.add_argument("--minutes", type=float, default=25.0, help="wall-clock training budget (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=8, help="maximum epochs (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per batch")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--max-tokens", type=int, default=128, help="texts are truncated to this many tokens")
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--limit", type=int, help="use only this many training examples (smoke tests)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    command = shlex.join(["python", "-m", "export.train", *argv])
    out = args.out or Path("checkpoints") / args.task
    state = args.state or Path("runs") / args.task / "state.pt"
    model_cfg = ModelConfig(
        d_model=args.d_model, n_heads=args.heads, n_layers=args.layers, d_ff=args.d_ff, dropout=args.dropout
    )
    train_cfg = TrainConfig(
        max_epochs=args.epochs, max_minutes=args.minutes, lr=args.lr, batch_tokens=args.batch_tokens, seed=args.seed
    )
    if args.task == "sentiment":
        from export import sentiment

        sentiment.run(args.data_dir, out, model_cfg, train_cfg, args.vocab_size, args.max_tokens, state, args.limit, command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
