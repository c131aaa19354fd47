"""Checkpoint folders: `model.safetensors`, `config.json`, `tokenizer*.json`, `metrics.json`.

A checkpoint is what the ONNX export and the serving layer read; it holds no optimizer state
(that lives in the resumable state file under `runs/`). Weights are stored in float16 to stay
well under 30 MB; `round_to_stored_precision` is applied before the final evaluation, so the
reported metrics are those of exactly the stored weights (loaded back into float32).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

CONFIG_FILE, WEIGHTS_FILE, METRICS_FILE = "config.json", "model.safetensors", "metrics.json"
STORED_DTYPE = torch.float16


def save_checkpoint(out_dir: Path, model: nn.Module, config: dict, metrics: dict) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Tied / shared tensors must be stored once; clone to contiguous standalone tensors.
    state = {k: _stored(v).contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(out_dir / WEIGHTS_FILE))
    write_json(out_dir / CONFIG_FILE, config)
    write_json(out_dir / METRICS_FILE, metrics)


def _stored(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(STORED_DTYPE) if t.is_floating_point() else t.detach()


@torch.no_grad()
def round_to_stored_precision(model: nn.Module) -> nn.Module:
    """Round float weights to what the checkpoint will hold, so evaluation sees the stored model."""
    for tensor in model.parameters():  # buffers (RoPE tables) are rebuilt in float32 on load
        if tensor.is_floating_point():
            tensor.copy_(tensor.to(STORED_DTYPE).to(tensor.dtype))
    return model


def load_weights(out_dir: Path, model: nn.Module) -> nn.Module:
    state = load_file(str(Path(out_dir) / WEIGHTS_FILE))
    model.load_state_dict(state)  # copies into the model's float32 parameters
    return model.eval()


def read_json(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path: Path, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=2)
        f.write("\n")
