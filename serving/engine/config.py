"""What the engine needs of a checkpoint, read once from its config.json: one constructor for every caller (the
front model, the benchmarks, the tests)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.engine.search import Decoding


@dataclass(frozen=True)
class Shapes:
    """The model's sizes the engine allocates its caches with."""

    n_layers: int  # decoder layers: self-attention caches
    n_cross: int  # cross-attention (key, value) pairs: decoder layers (+ the copy pointer's)
    n_heads: int
    head_dim: int


@dataclass(frozen=True)
class EngineConfig:
    shapes: Shapes
    decoding: Decoding

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> EngineConfig:
        """From a checkpoint's config.json as a dict: the model's sizes under ``model``, the decoding settings the
        checkpoint was scored with at the top level (missing: no length penalty, no n-gram blocking)."""
        model = config["model"]
        layers, heads = model["n_decoder_layers"], model["n_heads"]
        return cls(
            Shapes(layers, layers + int(model.get("copy", False)), heads, model["d_model"] // heads),
            Decoding(
                model["bos_id"],
                model["eos_id"],
                config.get("length_penalty", 1.0),
                config.get("no_repeat_ngram_size", 0),
            ),
        )

    @classmethod
    def read(cls, path: Path) -> EngineConfig:
        """From a config.json file."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
