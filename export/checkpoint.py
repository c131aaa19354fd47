"""Checkpoint folders: `model.safetensors`, `config.json`, `tokenizer*.json`, `metrics.json`.

A checkpoint is what the ONNX export and the serving layer read; it holds no optimizer state
(that lives in the resumable state file under `runs/`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

CONFIG_FILE, WEIGHTS_FILE, METRICS_FILE = "config.json", "model.safetensors", "metrics.json"


def save_checkpoint(out_dir: Path, model: nn.Module, config: dict, metrics: dict) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Tied / shared tensors must be stored once; clone to contiguous standalone tensors.
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(out_dir / WEIGHTS_FILE))
    write_json(out_dir / CONFIG_FILE, config)
    write_json(out_dir / METRICS_FILE, metrics)


def load_weights(out_dir: Path, model: nn.Module) -> nn.Module:
    state = load_file(str(Path(out_dir) / WEIGHTS_FILE))
    model.load_state_dict(state)
    return model.eval()


def read_json(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path: Path, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=2)
        f.write("\n")

