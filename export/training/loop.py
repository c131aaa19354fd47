"""The training loop every task shares: length-bucketed batches, AdamW with warm-up and cosine
decay, a wall-clock budget, a progress bar, and a resumable state file.

A task supplies a model, its examples and a loss function; this module knows nothing about
sentiment or translation.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm import tqdm

from serving.text.tokenizer import UNK_ID


@dataclass
class TrainConfig:
    max_epochs: int = 10
    max_minutes: float = 25.0  # wall-clock budget; training stops cleanly when it is spent
    batch_tokens: int = 4096  # padded tokens per batch (batch size adapts to length)
    max_batch_size: int = 128
    lr: float = 1e-3
    warmup_steps: int = 200
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 13
    threads: int = 0  # 0 = torch default (all cores)
    bf16: bool = False  # bfloat16 autocast (weights, optimizer stay fp32): ~1.5× faster on AVX512-BF16 CPUs
    ema: float = 0.0  # > 0: evaluate and keep an exponential moving average of the weights (decay per step)


def length_batches(
    lengths: Sequence[int], batch_tokens: int, max_batch_size: int, rng: random.Random | None
) -> list[list[int]]:
    """Group example indices of similar length so little compute is spent on padding.

    Sort by length inside shuffled windows of ~100 batches, cut batches by padded-token budget,
    then shuffle the batch order (rng=None keeps it deterministic, for evaluation).
    """
    order = list(range(len(lengths)))
    if rng is not None:
        rng.shuffle(order)
    window = max_batch_size * 100
    batches: list[list[int]] = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: lengths[i])
        batch: list[int] = []
        longest = 0
        for i in chunk:
            longest_if_added = max(longest, lengths[i])
            if batch and (longest_if_added * (len(batch) + 1) > batch_tokens or len(batch) >= max_batch_size):
                batches.append(batch)
                batch, longest_if_added = [], lengths[i]
            batch.append(i)
            longest = longest_if_added
        if batch:
            batches.append(batch)
    if rng is not None:
        rng.shuffle(batches)
    return batches


def drop_tokens(x: Tensor, mask: Tensor, rate: float) -> Tensor:
    """Replace a fraction of real tokens (mask == 1) by [UNK]: word dropout, a cheap regularizer
    for small data (Sennrich & Zhang 2019, "Revisiting Low-Resource Neural Machine Translation")."""
    if rate <= 0:
        return x
    return x.masked_fill((torch.rand(x.shape) < rate) & (mask == 1), UNK_ID)


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int = 0, multiple: int = 8) -> tuple[Tensor, Tensor]:
    """ids [B, S] and mask [B, S] (1 = token), S rounded up to a multiple of 8 (as served)."""
    longest = max(1, max(len(s) for s in seqs))
    width = -(-longest // multiple) * multiple
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(seqs), width), dtype=torch.int64)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.int64)
        mask[row, : len(seq)] = 1
    return ids, mask


def lr_at(step: int, total: int, cfg: TrainConfig, time_fraction: float = 0.0) -> float:
    """Linear warm-up, then cosine decay to 5% of the peak. Progress is the larger of the step
    fraction and the fraction of the time budget spent, so a run cut short by its budget still
    ends with a low learning rate instead of stopping mid-schedule."""
    warmup = min(cfg.warmup_steps, total // 10 + 1)  # short runs must not spend all their steps warming up
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress = min(1.0, max((step - warmup) / max(1, total - warmup), time_fraction))
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


class WeightAverage:
    """Exponential moving average of a model's floating-point weights, one update per optimizer step.

    The decay ramps up as min(decay, (1 + step) / (10 + step)), so early, still-random weights fade out fast.
    Averaging the weights of the last few thousand steps smooths the noise of the final updates, like averaging
    the last checkpoints (Vaswani et al. 2017), without knowing in advance which epoch is the last.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        weight = 1.0 - min(self.decay, (1 + step) / (10 + step))
        state = model.state_dict()
        torch._foreach_lerp_(list(self.shadow.values()), [state[k] for k in self.shadow], weight)

    def swap(self, model: nn.Module) -> None:
        """Exchange the model's weights and the averaged ones (call again to swap back)."""
        state = model.state_dict()
        with torch.no_grad():
            for k, v in self.shadow.items():
                current = state[k].detach().clone()
                state[k].copy_(v)
                v.copy_(current)


LossFn = Callable[[nn.Module, list[int]], Tensor]
EvalFn = Callable[[nn.Module], dict[str, float]]


def train(
    model: nn.Module,
    lengths: Sequence[int],
    loss_fn: LossFn,
    cfg: TrainConfig,
    evaluate: EvalFn | None = None,
    select_metric: str | None = None,
    state_path: Path | None = None,
    desc: str = "train",
) -> dict:
    """Train until max_epochs or max_minutes; returns a history dict.

    loss_fn(model, example_indices) → scalar loss for one batch. When `evaluate` is given it
    runs after each epoch and the weights with the best `select_metric` are kept (the last weights
    when select_metric is None). With `cfg.ema` the averaged weights are the ones evaluated,
    selected and returned. When `state_path` exists, training resumes from it (model, optimizer, epoch, step, best).
    """
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rng = random.Random(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "embed" in n]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.98),
    )
    steps_per_epoch = len(length_batches(lengths, cfg.batch_tokens, cfg.max_batch_size, None))
    total_steps = steps_per_epoch * cfg.max_epochs
    history: dict = {"train_config": asdict(cfg), "epochs": [], "steps_per_epoch": steps_per_epoch}
    start_epoch, step, best, best_state, spent = 0, 0, -math.inf, None, 0.0
    average = WeightAverage(model, cfg.ema) if cfg.ema > 0 else None

    if state_path is not None and Path(state_path).exists():
        saved = torch.load(state_path, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        start_epoch, step, best, best_state = saved["epoch"], saved["step"], saved["best"], saved["best_state"]
        history, spent = saved["history"], saved["spent_s"]
        if average is not None and saved.get("ema") is not None:
            average.shadow = saved["ema"]
        rng.setstate(saved["rng"])
        print(f"resumed from {state_path}: epoch {start_epoch}, step {step}, {spent / 60:.1f} min spent")

    budget_s = cfg.max_minutes * 60
    t0 = time.monotonic() - spent
    out_of_time = False
    for epoch in range(start_epoch, cfg.max_epochs):
        if time.monotonic() - t0 > budget_s:  # resumed after the budget was spent: nothing more to train
            break
        model.train()
        batches = length_batches(lengths, cfg.batch_tokens, cfg.max_batch_size, rng)
        bar = tqdm(batches, desc=f"{desc} epoch {epoch + 1}/{cfg.max_epochs}", unit="batch", dynamic_ncols=True)
        running, loss_sum, n_batches = 0.0, 0.0, 0
        for i, batch in enumerate(bar):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, total_steps, cfg, (time.monotonic() - t0) / budget_s)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                loss = loss_fn(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            if average is not None:
                average.update(model, step)
            step += 1
            loss_sum, n_batches = loss_sum + loss.item(), n_batches + 1
            running = 0.98 * running + 0.02 * loss.item() if i else loss.item()
            bar.set_postfix(loss=f"{running:.3f}", lr=f"{opt.param_groups[0]['lr']:.1e}")
            if time.monotonic() - t0 > budget_s:
                out_of_time = True
                break
        bar.close()
        record: dict = {"epoch": epoch + 1, "step": step, "train_loss": round(loss_sum / max(1, n_batches), 4)}
        if evaluate is not None:
            if average is not None:
                average.swap(model)  # evaluate (and keep) the averaged weights
            model.eval()
            with torch.no_grad():
                record.update(evaluate(model))
            if select_metric is not None and record[select_metric] > best:
                best = record[select_metric]
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if average is not None:
                average.swap(model)
        record["minutes"] = round((time.monotonic() - t0) / 60, 2)
        history["epochs"].append(record)
        print(" ".join(f"{k}={v}" for k, v in record.items()))
        if state_path is not None:
            Path(state_path).parent.mkdir(parents=True, exist_ok=True)
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "epoch": epoch + 1,
                    "step": step,
                    "best": best,
                    "best_state": best_state,
                    "history": history,
                    "spent_s": time.monotonic() - t0,
                    "rng": rng.getstate(),
                    "ema": average.shadow if average is not None else None,
                },
                state_path,
            )
        if out_of_time:
            print(f"time budget of {cfg.max_minutes} min reached after epoch {epoch + 1}")
            break
    if average is not None:
        average.swap(model)  # the averaged weights are the result; a best_state below is averaged too
    if select_metric is not None and best_state is not None:
        model.load_state_dict(best_state)
        history["selected"] = {select_metric: best}
    history["minutes"] = round((time.monotonic() - t0) / 60, 2)
    return history
