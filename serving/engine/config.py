"""What the engine needs of a checkpoint beyond its graphs, read once from its config.json: one constructor for
every caller (the front model, the benchmarks, the tests). The model's sizes come from the graphs themselves
(tasks/generation_contract.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.engine.search import Decoding


@dataclass(frozen=True)
class EngineConfig:
    decoding: Decoding

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> EngineConfig:
        """From a checkpoint's config.json as a dict. An imported checkpoint (export/import_hf) states its
        decoding rules in a ``generation`` table; our own trainer's keeps the special ids under ``model`` and the
        settings it was scored with at the top level (missing: no length penalty, no n-gram blocking), and follows
        ONNX Runtime's BeamSearch rules (early stopping)."""
        generation = config.get("generation")
        if generation is not None:
            return cls(
                Decoding(
                    generation["decoder_start_id"],
                    generation["eos_id"],
                    generation.get("length_penalty", 1.0),
                    generation.get("no_repeat_ngram_size", 0),
                    generation.get("early_stopping", True),
                    generation.get("forced_eos", False),
                    tuple(generation.get("other_eos_ids", ())),
                    huggingface=True,
                )
            )
        model = config["model"]
        return cls(
            Decoding(
                model["bos_id"],
                model["eos_id"],
                config.get("length_penalty", 1.0),
                config.get("no_repeat_ngram_size", 0),
            )
        )

    @classmethod
    def read(cls, path: Path) -> EngineConfig:
        """From a config.json file."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
