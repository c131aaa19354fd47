"""Training step time, fp32 vs bfloat16 autocast (`export.train --bf16`), for the translation model.

    .venv/bin/python -m benchmarks.train_step [--threads 2] [--repeats 7]

One batch of 128 random pairs (8–20 tokens a side) in the shipped translate architecture
(checkpoints/translate/config.json, fresh weights); forward,
backward and an AdamW step, the two modes interleaved; prints the median seconds per step and the ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from benchmarks.profiles import CHECKPOINTS
from export.model.checkpoint import read_json
from export.model.config import ModelConfig
from export.model.transformer import Seq2Seq
from export.training.seq2seq import seq2seq_loss


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.train_step", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7, help="timed steps per mode (after one warm-up step)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rng = random.Random(0)
    cfg = ModelConfig.from_dict(read_json(CHECKPOINTS / "translate" / "config.json")["model"])
    model = Seq2Seq(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def ids(vocab: int) -> list[int]:
        return [rng.randint(4, vocab - 1) for _ in range(rng.randint(8, 20))]

    batch = [(ids(cfg.vocab_size) + [cfg.eos_id], ids(cfg.tgt_vocab_size)) for _ in range(128)]
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for i in range(args.repeats + 1):
        for mode in times:
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
                loss = seq2seq_loss(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i:  # the first round warms up
                times[mode].append(time.perf_counter() - t0)
    fp32, bf16 = statistics.median(times["fp32"]), statistics.median(times["bf16"])
    print(f"threads {args.threads}: fp32 {fp32:.3f} s/step, bf16 {bf16:.3f} s/step, bf16 speed-up {fp32 / bf16:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
