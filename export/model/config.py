"""A model's sizes and choices, as saved in a checkpoint's config.json (``model``): what every other module of the
model reads, so it imports none of them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

# How attention learns where tokens are (export/model/positional.py implements them; ABLATION.md measures them).
POSITIONAL_SCHEMES = ("rope", "sinusoidal", "learned", "relative_bias")


@dataclass
class ModelConfig:
    vocab_size: int = 8000
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 1024
    max_len: int = 512  # longest sequence the RoPE tables cover; inputs are truncated to it
    dropout: float = 0.1
    rope_base: float = 10000.0
    pad_id: int = 0
    num_labels: int = 2
    # Encoder-decoder fields; the defaults mean "encoder only" so sentiment configs load unchanged.
    tgt_vocab_size: int = 0  # 0 → same vocabulary as the source
    n_decoder_layers: int = 0
    bos_id: int = 2  # decoder start token (the project's tokenizers: pad 0, unk 1, bos 2, eos 3)
    eos_id: int = 3
    # How attention learns where tokens are; one of POSITIONAL_SCHEMES (export/model/positional.py).
    positional: str = "rope"
    relative_buckets: int = 32  # "relative_bias": T5's buckets of i - j, half per direction
    relative_max_distance: int = 128  # "relative_bias": distances from here on share the last bucket
    # Encoder-decoder with one vocabulary: mix a pointer (copy) distribution over the source tokens into
    # the output (See et al. 2017). Summaries copy phrases from their text; see CopyPointer (export/model/heads.py).
    copy: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def target_vocab_size(self) -> int:
        return self.tgt_vocab_size or self.vocab_size

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.positional not in POSITIONAL_SCHEMES:
            raise ValueError(f"positional={self.positional!r} is not one of {', '.join(POSITIONAL_SCHEMES)}")
        if self.positional == "rope" and self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"d_model={self.d_model} must be even for sinusoidal positions (sin/cos pairs)")
        if self.copy and self.tgt_vocab_size not in (0, self.vocab_size):
            raise ValueError("copy needs one vocabulary for source and target (tgt_vocab_size 0 or vocab_size)")
        if self.positional == "relative_bias" and (self.relative_buckets < 4 or self.relative_buckets % 4):
            raise ValueError(f"relative_buckets={self.relative_buckets} must be a positive multiple of 4")
