"""A Hugging Face decoder-only LM folder (Qwen2, Qwen3, Llama, Mistral) → the generation contract's decoder-only
graphs (tasks/generation_contract.py): a prefill graph and a one-token decoder step.

The weights stay Hugging Face's own modules; only the forward is written here. Every attention is one
`com.microsoft::GroupQueryAttention` node with the model's own key/value heads (kept grouped: a Qwen2.5-0.5B
cache holds 2 heads, not 14), rotary positions the fused `com.microsoft::RotaryEmbedding` on Q and K just before
it, as our own models' graphs do. The cos/sin tables are the model's own rotary module's output for every
position the served context reaches, so a `rope_scaling` whose angles depend only on the position (linear, YaRN
with its attention factor, Llama 3's) is exact; those that change with the sequence's length (dynamic NTK,
LongRoPE) are refused by name.

The model, as transformers computes it: x = embed(ids); per layer x += o(attn(RoPE(q(n1(x))), RoPE(k(n1(x))),
v(n1(x)))) and x += mlp(n2(x)) (RMS norms; Qwen3 adds per-head RMS norms on q and k before RoPE); logits =
lm_head(norm(x)).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from export.graphs.seq2seq_export import export_module
from export.model.attention import ort_op
from tasks import generation_contract as contract

ARCHITECTURES = {  # model_type → the class save_pretrained names, and what the engine's graphs cover of it
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
}
ROPE_TYPES = ("default", "linear", "yarn", "llama3")  # angles fixed per position: tabulated exactly


class UnsupportedCheckpoint(ValueError):
    """A folder the importer cannot serve exactly; the message names the field."""


def refuse(field: str, value: Any, why: str) -> UnsupportedCheckpoint:
    return UnsupportedCheckpoint(f"{field} = {value!r} is not supported: {why}")


@dataclass(frozen=True)
class CausalSettings:
    """What the importer reads from the folder's config.json and generation_config.json, checked before anything
    is written."""

    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    context: int  # prompt plus answer, in tokens: the positions tabulated (capped by a sliding window)
    eos_ids: tuple[int, ...]  # any of them ends an answer (the first is the engine's eos_id)
    num_beams: int
    length_penalty: float
    max_new_tokens: int
    no_repeat_ngram_size: int
    early_stopping: bool
    rope_type: str
    ignored: tuple[str, ...]  # sampling settings the task endpoints leave out (the chat twin's), in the model card
    # The folder's sampling settings when it samples: the chat twin's defaults (the OpenAI API's, as vLLM takes a
    # model's generation config), never the task endpoints'.
    sampling: tuple[tuple[str, float], ...] = ()


CONTEXT_CAP = 4096  # the positions tabulated at most: what a translation or summary prompt and its answer need


def read_settings(config: Any, generation: Any) -> CausalSettings:
    """The model's sizes and `generate`'s rules; raises UnsupportedCheckpoint naming the field that the graphs or
    the engine cannot reproduce. A folder that samples is served greedily or by beam search on its task endpoints
    (its sampling settings are then listed in `ignored`) and sampled on its chat twin."""
    if config.model_type not in ARCHITECTURES:
        names = ", ".join(f"{t} ({c})" for t, c in ARCHITECTURES.items())
        raise refuse("config.model_type", config.model_type, f"decoder-only imports cover {names}")
    if config.hidden_act != "silu":
        raise refuse("config.hidden_act", config.hidden_act, "the SwiGLU MLP with silu only")
    rope = dict(getattr(config, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        raise refuse(
            "config.rope_scaling.rope_type",
            rope_type,
            f"its angles change with the sequence's length; exact types: {', '.join(ROPE_TYPES)}",
        )
    partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    if partial not in (None, 1.0):
        raise refuse("config.partial_rotary_factor", partial, "RoPE over the whole head only")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    if heads % kv_heads:
        raise refuse("config.num_key_value_heads", kv_heads, f"it must divide num_attention_heads ({heads})")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    context = min(config.max_position_embeddings, CONTEXT_CAP)
    layer_types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    if window and (config.model_type == "mistral" or "sliding_attention" in layer_types):
        context = min(context, window)  # within the window a sliding-window layer attends to every key: exact
    checks = {
        "generation_config.num_return_sequences": (generation.num_return_sequences or 1, 1),
        "generation_config.min_length": (generation.min_length or 0, 0),
        "generation_config.min_new_tokens": (generation.min_new_tokens or 0, 0),
        "generation_config.num_beam_groups": (getattr(generation, "num_beam_groups", 1) or 1, 1),
        "generation_config.forced_bos_token_id": (generation.forced_bos_token_id, None),
        "generation_config.forced_eos_token_id": (generation.forced_eos_token_id, None),
        "generation_config.bad_words_ids": (generation.bad_words_ids, None),
    }
    ignored = []
    if generation.do_sample:
        ignored += [f"{f} = {getattr(generation, f)!r}" for f in ("do_sample", "temperature", "top_p", "top_k")]
    if (generation.repetition_penalty or 1.0) != 1.0:
        ignored.append(f"repetition_penalty = {generation.repetition_penalty!r}")
    for field, (value, wanted) in checks.items():
        if value != wanted:
            raise refuse(field, value, f"the engine decodes with {wanted!r} only")
    if generation.early_stopping not in (True, False, None):
        raise refuse("generation_config.early_stopping", generation.early_stopping, "True or False only")
    eos = generation.eos_token_id if generation.eos_token_id is not None else config.eos_token_id
    eos_ids = tuple(int(t) for t in (eos if isinstance(eos, list) else [eos]) if t is not None)
    if not eos_ids:
        raise refuse("generation_config.eos_token_id", eos, "an answer must end at some token")
    if generation.max_new_tokens is not None:
        max_new = generation.max_new_tokens
    else:
        max_new = 256  # generate's max_length counts the prompt: a translation's answer needs no more
    return CausalSettings(
        model_type=config.model_type,
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=config.vocab_size,
        context=context,
        eos_ids=eos_ids,
        num_beams=int(generation.num_beams or 1),
        length_penalty=float(1.0 if generation.length_penalty is None else generation.length_penalty),
        max_new_tokens=int(min(max_new, context // 2)),
        no_repeat_ngram_size=int(generation.no_repeat_ngram_size or 0),
        early_stopping=bool(generation.early_stopping),
        rope_type=rope_type,
        ignored=tuple(ignored),
        sampling=_sampling_defaults(generation),
    )


def _sampling_defaults(generation: Any) -> tuple[tuple[str, float], ...]:
    if not generation.do_sample:
        return (("temperature", 0.0),)  # a greedy folder's chat twin is greedy unless a request says otherwise
    values = {
        "temperature": generation.temperature,
        "top_p": generation.top_p,
        "top_k": generation.top_k,
        "repetition_penalty": generation.repetition_penalty,
    }
    return tuple((key, float(value)) for key, value in values.items() if value is not None)


def rope_tables(model: nn.Module, context: int) -> tuple[Tensor, Tensor]:
    """cos/sin [context, head_dim/2] from the model's own rotary module (its scaling and attention factor
    included), in float32 as it computes them: RotaryEmbedding's half-split layout repeats each half."""
    positions = torch.arange(context)[None]
    probe = torch.zeros(1, dtype=torch.float32)
    cos, sin = model.model.rotary_emb(probe, positions)
    half = cos.shape[-1] // 2
    return cos[0, :, :half].float().contiguous(), sin[0, :, :half].float().contiguous()


class _Layers(nn.Module):
    """The decoder layers with their attention written as the fused nodes; shared by both graphs."""

    def __init__(self, model: nn.Module, settings: CausalSettings) -> None:
        super().__init__()
        self.embed = model.model.embed_tokens
        self.layers = model.model.layers
        self.norm = model.model.norm
        self.s = settings
        cos, sin = rope_tables(model, settings.context)
        self.register_buffer("rope_cos", cos, persistent=False)  # "rope_": kept float by the int8 quantizer
        self.register_buffer("rope_sin", sin, persistent=False)

    def rotate(self, x: Tensor, positions: Tensor, norm: nn.Module | None) -> Tensor:
        """x [B, S, heads·Dh] rotated at positions [B, S]; Qwen3's per-head RMS norm first."""
        if norm is not None:
            b, t, d = x.shape
            x = norm(x.view(b, t, d // self.s.head_dim, self.s.head_dim)).view(b, t, d)
        tables = (x, positions, self.rope_cos, self.rope_sin)
        return ort_op("RotaryEmbedding", tables, {"interleaved": 0}, x.dtype, x.shape)

    def attend(self, layer: nn.Module, x: Tensor, positions: Tensor, past: tuple, seqlens: Tensor, total: Tensor):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = self.rotate(a.q_proj(h), positions, getattr(a, "q_norm", None))
        k = self.rotate(a.k_proj(h), positions, getattr(a, "k_norm", None))
        v = a.v_proj(h)
        attrs = {"num_heads": self.s.heads, "kv_num_heads": self.s.kv_heads}
        shape = past[0].shape
        inputs = (q, k, v, *past, seqlens, total)
        out, key, value = ort_op("GroupQueryAttention", inputs, attrs, q.dtype, q.shape, shape, shape)
        return x + a.o_proj(out), key, value


class StepGraph(_Layers):
    """S new tokens per row at positions positions[r].., their keys and values written into the cache buffer in
    place: one token per row when decoding, a chunk of a prompt when prefilling. A row with fewer tokens is
    right-padded: its padding's keys land after its own, where its next call (or nothing) overwrites them."""

    def __init__(self, model: nn.Module, settings: CausalSettings) -> None:
        super().__init__(model, settings)
        self.lm_head = model.lm_head

    def forward(self, input_ids: Tensor, positions: Tensor, *caches: Tensor) -> tuple[Tensor, ...]:
        x = self.embed(input_ids.long())  # [R, S, D]
        tokens = input_ids.shape[1]
        offsets = torch.arange(tokens, dtype=torch.int64)[None]
        at = (positions[:, None] + offsets).clamp(max=self.s.context - 1)  # padding past the tables reads the last
        seqlens = (positions + tokens - 1).to(torch.int32)  # GroupQueryAttention: each row's keys after, less one
        total = (positions.max() + tokens).to(torch.int32)
        presents: list[Tensor] = []
        for i, layer in enumerate(self.layers):
            x, key, value = self.attend(layer, x, at, caches[2 * i : 2 * i + 2], seqlens, total)
            presents += [key, value]
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        # The last column's only: what a decode step reads. Kept 3-D ([R, 1, D]): a 2-D input makes the exporter's
        # projection one the int8 quantizer gets wrong (its graph then fails to load: "Incompatible dimensions").
        logits = self.lm_head(self.norm(x[:, -1:]))[:, -1].float()
        log_probs = logits.log_softmax(-1)
        top_log_probs, top_ids = log_probs.topk(contract.TOP_K, dim=-1)
        return log_probs, top_log_probs, top_ids, *presents


def export_step(model: nn.Module, settings: CausalSettings):
    rows, tokens, capacity = 6, 3, 12
    ids = torch.randint(0, settings.vocab_size, (rows, tokens), dtype=torch.int32)
    positions = torch.tensor([4, 4, 0, 0, 7, 2])
    past = [torch.randn(rows, settings.kv_heads, capacity, settings.head_dim) for _ in range(2 * settings.layers)]
    batch = torch.export.Dim("batch", min=1, max=4096)
    new = torch.export.Dim("tokens", min=1, max=settings.context)
    columns = torch.export.Dim("capacity", min=2, max=settings.context)
    shapes = ({0: batch, 1: new}, {0: batch}, tuple([{0: batch, 2: columns}] * (2 * settings.layers)))
    names_in, names_out = contract.decoder_inputs(settings.layers, 0), contract.decoder_outputs(settings.layers)
    return export_module(StepGraph(model, settings), (ids, positions, *past), names_in, names_out, shapes)


def load(folder: Path) -> tuple[nn.Module, CausalSettings]:
    """The model (eval mode, float32) and its settings; nothing is written."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(folder)
    try:
        generation = GenerationConfig.from_pretrained(folder)
    except OSError:  # no generation_config.json: generate's defaults from the model config
        generation = GenerationConfig.from_model_config(config)
    settings = read_settings(config, generation)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return model, settings
