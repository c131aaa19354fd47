"""`translate` and `summarize`: texts → one BLS call per (max_new_tokens, num_beams) group to the
task's BeamSearch generator → detokenized text.

Requests in one Triton batch that ask for different settings are grouped, not forced to one
setting: each group is one generator call (the generator takes one max_length and num_beams
per call).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Tokenizer

from export.tokenizer import EOS_ID, detokenize, strip_generated
from serving.frontends.base import BatchTokenizer, Encoded, FrontModel, decode_int_option

MAX_BEAMS = 8
DEFAULT_BEAMS = 4


class GenerationFront(FrontModel):
    """Front model for an encoder-decoder task; the output name comes from config.pbtxt."""

    def __init__(self, pb: Any, args: dict) -> None:
        super().__init__(pb, args)
        self.outputs = (self.model_config["output"][0]["name"],)
        params = {k: v["string_value"] for k, v in self.model_config.get("parameters", {}).items()}
        self.generator = params["generator"]
        cfg = self.task_config
        self.source = BatchTokenizer.from_file(self.asset_dir / "tokenizer.json", cfg["max_tokens"])
        self.target = Tokenizer.from_file(str(self.asset_dir / "target_tokenizer.json"))
        self.default_new_tokens = int(cfg["max_new_tokens"])
        self.max_new_tokens = int(cfg["max_new_tokens_limit"])

    def parse_options(self, request: Any, rows: int) -> tuple:
        def read(name: str) -> np.ndarray | None:
            tensor = self.pb.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

        new_tokens = decode_int_option(
            read("MAX_NEW_TOKENS"), "MAX_NEW_TOKENS", rows, self.default_new_tokens, 1, self.max_new_tokens
        )
        beams = decode_int_option(read("NUM_BEAMS"), "NUM_BEAMS", rows, DEFAULT_BEAMS, 1, MAX_BEAMS)
        return (new_tokens, beams)

    def run_group(self, texts: list[str], options: tuple) -> list[tuple]:
        _, generated = self.generate(texts, options)
        return [(detokenize(self.target, tokens),) for tokens in generated]

    def generate(self, texts: list[str], options: tuple) -> tuple[Encoded, list[list[int]]]:
        """The encoded sources and the generated token ids (no bos/eos) per text: one generator call."""
        new_tokens, beams = options
        batch = self.encode(self.source, texts, suffix=[EOS_ID])
        feeds = {
            "input_ids": batch.ids.astype(np.int32),
            "attention_mask": batch.mask.astype(np.int32),
            "max_length": np.array([new_tokens + 1], dtype=np.int32),  # the start token counts
            "num_beams": np.array([beams], dtype=np.int32),
        }
        sequences = self.bls(self.generator, feeds, ["sequences"])["sequences"]  # [B, 1, L]
        generated = [strip_generated(row[0])[:new_tokens] for row in sequences]
        self.metrics.generated(sum(len(tokens) for tokens in generated))
        return batch, generated
