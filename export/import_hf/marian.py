"""A Hugging Face `MarianMTModel` folder → the generation contract's two graphs (tasks/generation_contract.py).

The weights stay Hugging Face's own modules; only the forward is written here, as our exporter writes ours: every
attention one fused ONNX Runtime node (`MultiHeadAttention` for the encoder and the cross-attention,
`GroupQueryAttention` writing the decoder's cache in place), so the engine serves the model exactly as it serves
ours: continuous batching, exact beam streaming, documents.

Marian, as transformers computes it: token embeddings × √d_model (`scale_embedding`) plus sinusoidal positions
(sin in the first half, cos in the second); post-norm blocks (x = LN(x + SelfAttn(x)), then cross-attention, then
x = LN(x + FFN(x))); no final layer norm; logits = h · Eᵀ + final_logits_bias. `generate` starts the decoder at
`decoder_start_token_id` (the pad token), bans `bad_words_ids` after the log-softmax and, at the last step allowed,
forces `forced_eos_token_id`; the engine's `Decoding` follows those rules (serving/engine/search.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from export.graphs.seq2seq_export import export_module
from export.graphs.step_export import decoder_example, source_example
from export.model.attention import attention, group_by_source, split_heads
from tasks import generation_contract as contract

ACTIVATIONS = ("swish", "silu", "gelu", "relu")  # transformers' ACT2FN names whose ONNX export is plain


@dataclass(frozen=True)
class MarianSettings:
    """What the importer reads from the folder, checked before anything is written."""

    encoder_layers: int
    decoder_layers: int
    d_model: int
    encoder_heads: int
    decoder_heads: int
    vocab_size: int
    max_positions: int
    decoder_start_id: int
    eos_id: int
    pad_id: int
    banned: tuple[int, ...]  # single-token bad_words_ids: never generated
    num_beams: int
    length_penalty: float
    max_new_tokens: int
    no_repeat_ngram_size: int
    early_stopping: bool
    forced_eos: bool
    renormalize_logits: bool


class UnsupportedCheckpoint(ValueError):
    """A folder the importer cannot serve exactly; the message names the field."""


def read_settings(config: Any, generation: Any) -> MarianSettings:
    """The model's sizes and `generate`'s rules from a `MarianConfig` and `GenerationConfig`; raises
    UnsupportedCheckpoint naming the field when the engine could not reproduce `generate` with them."""

    def refuse(field: str, value: Any, why: str) -> UnsupportedCheckpoint:
        return UnsupportedCheckpoint(f"{field} = {value!r} is not supported: {why}")

    if config.model_type != "marian":
        raise refuse("config.model_type", config.model_type, "--task translate imports MarianMTModel ('marian')")
    if config.activation_function not in ACTIVATIONS:
        raise refuse("config.activation_function", config.activation_function, f"one of {', '.join(ACTIVATIONS)}")
    if getattr(config, "share_encoder_decoder_embeddings", True) is False:
        raise refuse("config.share_encoder_decoder_embeddings", False, "separate source and target vocabularies")
    if config.d_model % config.encoder_attention_heads or config.d_model % config.decoder_attention_heads:
        raise refuse("config.d_model", config.d_model, "not divisible by the attention heads")
    checks = {
        "generation_config.do_sample": (bool(generation.do_sample), False),
        "generation_config.num_return_sequences": (generation.num_return_sequences or 1, 1),
        "generation_config.repetition_penalty": (generation.repetition_penalty or 1.0, 1.0),
        "generation_config.min_length": (generation.min_length or 0, 0),
        "generation_config.min_new_tokens": (generation.min_new_tokens or 0, 0),
        "generation_config.num_beam_groups": (getattr(generation, "num_beam_groups", 1) or 1, 1),
        "generation_config.encoder_no_repeat_ngram_size": (generation.encoder_no_repeat_ngram_size or 0, 0),
        "generation_config.forced_bos_token_id": (generation.forced_bos_token_id, None),
    }
    for field, (value, wanted) in checks.items():
        if value != wanted:
            raise refuse(field, value, f"the engine decodes with {wanted!r} only")
    early_stopping = bool(generation.early_stopping)  # unset in a saved config: generate's default, False
    if generation.early_stopping not in (True, False, None):
        raise refuse("generation_config.early_stopping", generation.early_stopping, "True or False only")
    eos = generation.eos_token_id if generation.eos_token_id is not None else config.eos_token_id
    if isinstance(eos, list):
        if len(eos) != 1:
            raise refuse("generation_config.eos_token_id", eos, "one end-of-sequence token only")
        eos = eos[0]
    forced = generation.forced_eos_token_id
    if isinstance(forced, list):
        forced = forced[0] if len(forced) == 1 else forced
    if forced not in (None, eos):
        raise refuse("generation_config.forced_eos_token_id", forced, f"it must be the eos token ({eos}) or unset")
    banned = []
    for words in generation.bad_words_ids or []:
        if len(words) != 1:
            raise refuse("generation_config.bad_words_ids", words, "single-token entries only")
        banned.append(int(words[0]))
    start = generation.decoder_start_token_id
    start = config.decoder_start_token_id if start is None else start
    max_positions = config.max_position_embeddings
    if generation.max_new_tokens is not None:
        max_new = generation.max_new_tokens
    else:
        max_new = (generation.max_length or config.max_length or max_positions) - 1
    return MarianSettings(
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        d_model=config.d_model,
        encoder_heads=config.encoder_attention_heads,
        decoder_heads=config.decoder_attention_heads,
        vocab_size=config.vocab_size,
        max_positions=max_positions,
        decoder_start_id=int(start),
        eos_id=int(eos),
        pad_id=int(config.pad_token_id),
        banned=tuple(banned),
        num_beams=int(generation.num_beams or 1),
        length_penalty=float(1.0 if generation.length_penalty is None else generation.length_penalty),
        max_new_tokens=int(min(max_new, max_positions - 1)),
        no_repeat_ngram_size=int(generation.no_repeat_ngram_size or 0),
        early_stopping=early_stopping,
        forced_eos=forced is not None,
        renormalize_logits=bool(generation.renormalize_logits),
    )


def _attention_impl() -> str:
    """ONNX Runtime's fused nodes while exporting; SDPA in eager PyTorch (the parity checks)."""
    return "ort_fused" if torch.onnx.is_in_onnx_export() else "sdpa"


class MarianEncoderGraph(nn.Module):
    """input_ids (tokenizer ids), attention_mask → each decoder layer's cross-attention (key, value)."""

    def __init__(self, model: nn.Module, source_to_model: Tensor) -> None:
        super().__init__()
        self.encoder = model.model.encoder
        self.decoder_layers = model.model.decoder.layers
        self.register_buffer("source_to_model", source_to_model, persistent=False)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        encoder, impl = self.encoder, _attention_impl()
        ids = self.source_to_model[input_ids.long()]  # [B, S]: the tokenizer's ids → the model's
        x = encoder.embed_tokens(ids) * encoder.embed_scale + encoder.embed_positions.weight[: ids.shape[1]]
        for layer in encoder.layers:
            a = layer.self_attn
            h = attention(a.q_proj(x), a.k_proj(x), a.v_proj(x), impl, a.num_heads, key_padding_mask=attention_mask)
            x = layer.self_attn_layer_norm(x + a.out_proj(h.out))
            x = layer.final_layer_norm(x + layer.fc2(layer.activation_fn(layer.fc1(x))))
        cross = []
        for layer in self.decoder_layers:
            a = layer.encoder_attn
            cross += [split_heads(a.k_proj(x), a.num_heads), split_heads(a.v_proj(x), a.num_heads)]
        return tuple(cross)


class MarianDecoderGraph(nn.Module):
    """One decoding step for every row, each at its own position, as the contract's decoder step."""

    def __init__(self, model: nn.Module, settings: MarianSettings) -> None:
        super().__init__()
        self.decoder = model.model.decoder
        self.lm_head = model.lm_head
        self.register_buffer("logits_bias", model.final_logits_bias[0].clone(), persistent=False)
        banned = torch.zeros(settings.vocab_size)
        banned[list(settings.banned)] = float("-inf")
        self.register_buffer("banned", banned, persistent=False)
        self.renormalize = settings.renormalize_logits

    def forward(self, input_ids: Tensor, positions: Tensor, cross_mask: Tensor, *caches: Tensor) -> tuple[Tensor, ...]:
        decoder, impl = self.decoder, _attention_impl()
        n = 2 * len(decoder.layers)
        past, cross = caches[:n], caches[n:]
        x = decoder.embed_tokens(input_ids.long()) * decoder.embed_scale  # [R, 1, D]
        x = x + decoder.embed_positions.weight[positions][:, None, :]
        presents: list[Tensor] = []
        for i, layer in enumerate(decoder.layers):
            a = layer.self_attn
            q, k, v = a.q_proj(x), a.k_proj(x), a.v_proj(x)
            h = attention(q, k, v, impl, a.num_heads, past=past[2 * i : 2 * i + 2], cache_lengths=positions)
            presents += h.present
            x = layer.self_attn_layer_norm(x + a.out_proj(h.out))
            c = layer.encoder_attn
            keys, values = cross[2 * i], cross[2 * i + 1]
            q = group_by_source(c.q_proj(x), keys.shape[0])  # a source's rows share its memory
            h = attention(q, keys, values, impl, c.num_heads, key_padding_mask=cross_mask)
            x = layer.encoder_attn_layer_norm(x + c.out_proj(h.out.reshape(x.shape)))
            x = layer.final_layer_norm(x + layer.fc2(layer.activation_fn(layer.fc1(x))))
        logits = (self.lm_head(x)[:, -1] + self.logits_bias).float()  # 3-D: a MatMul the int8 quantizer reads
        if self.renormalize:  # generate's renormalize_logits: the banned tokens' mass goes to the others
            log_probs = (logits + self.banned).log_softmax(-1)
        else:  # generate bans after the log-softmax
            log_probs = logits.log_softmax(-1) + self.banned
        top_log_probs, top_ids = log_probs.topk(contract.TOP_K, dim=-1)
        return log_probs, top_log_probs, top_ids, *presents


def export_encoder(model: nn.Module, source_to_model: Tensor, settings: MarianSettings):
    args, shapes = source_example(4, len(source_to_model), settings.max_positions)
    outputs = contract.cross_names(settings.decoder_layers)
    return export_module(MarianEncoderGraph(model, source_to_model), args, list(shapes), outputs, shapes)


def export_decoder(model: nn.Module, settings: MarianSettings):
    layers, heads = settings.decoder_layers, settings.decoder_heads
    args, shapes = decoder_example(
        layers, layers, heads, settings.d_model // heads, settings.vocab_size, settings.max_positions
    )
    names_in, names_out = contract.decoder_inputs(layers, layers), contract.decoder_outputs(layers)
    return export_module(MarianDecoderGraph(model, settings), tuple(args), names_in, names_out, shapes)


def load(folder: Path) -> tuple[nn.Module, MarianSettings]:
    """The model (eval mode, float32) and its settings; nothing is written."""
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    config = MarianConfig.from_pretrained(folder)
    try:
        generation = GenerationConfig.from_pretrained(folder)
    except OSError:  # no generation_config.json: generate's defaults from the model config
        generation = GenerationConfig.from_model_config(config)
    settings = read_settings(config, generation)
    model = MarianMTModel.from_pretrained(folder, dtype=torch.float32).eval()
    return model, settings
