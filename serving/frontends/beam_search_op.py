"""`summarize`'s abstractive mode (and the baseline `translate` is benchmarked against): texts → one BLS call
per (max_new_tokens, num_beams) group to the task's BeamSearch generator (the model of role `generator` in its
definition) → detokenized text.

Requests in one Triton batch that ask for different settings are grouped, not forced to one
setting: each group is one generator call (the generator takes one max_length and num_beams
per call).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Tokenizer

from serving.frontends.base import BatchTokenizer, Encoded, FrontModel
from serving.frontends.options import GenerationOptions
from serving.text.tokenizer import EOS_ID, detokenize, strip_generated


class BeamSearchOpFront(FrontModel):
    """Front model for an encoder-decoder task with options `max_new_tokens` and `num_beams`."""

    Options: type = GenerationOptions

    def __init__(self, pb: Any, args: dict) -> None:
        super().__init__(pb, args)
        self.generator = self.models["generator"]
        self.source = BatchTokenizer.from_file(self.asset_dir / "tokenizer.json", self.task_config["max_tokens"])
        self.target = Tokenizer.from_file(str(self.asset_dir / "target_tokenizer.json"))

    def run_group(self, texts: list[str], options: GenerationOptions) -> list[tuple]:
        _, generated = self.generate(texts, options)
        return [(detokenize(self.target, tokens),) for tokens in generated]

    def generate(self, texts: list[str], options: GenerationOptions) -> tuple[Encoded, list[list[int]]]:
        """The encoded sources and the generated token ids (no bos/eos) per text: one generator call."""
        new_tokens, beams = options.max_new_tokens, options.num_beams
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
