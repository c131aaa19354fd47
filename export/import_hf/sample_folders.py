"""Hugging Face checkpoint folders built here with transformers' own classes, for the importer's tests and the
`imported` benchmark: no model hub is reachable from these machines.

A sample Marian folder is what `save_pretrained` writes for Helsinki-NLP's opus-mt models: config.json,
generation_config.json (the opus-mt decoding rules: beams, the pad token banned, forced eos, max_length 512),
model.safetensors, source.spm / target.spm (SentencePiece Unigram models trained here on the data's Chinese and
English sides) and vocab.json (their joint vocabulary, `</s>` 0, `<unk>` 1, `<pad>` last). The model is trained a
few steps on Tatoeba so that its choices are not ties (OPUS_MT says why the large one is not); its translations are
poor, which does not matter for parity or speed.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from export.training.data import DEFAULT_DATA_DIR, read_translation, read_translation_extra


@dataclass(frozen=True)
class MarianSize:
    encoder_layers: int
    decoder_layers: int
    d_model: int
    heads: int
    ffn: int
    source_vocab: int  # SentencePiece pieces per side; vocab.json joins them
    target_vocab: int
    train_steps: int
    init_std: float = 0.02  # transformers' default
    tokenizer_corpora: tuple[str, ...] = ()  # extra corpora (translation/extra) the SentencePiece models also read


TINY = MarianSize(2, 2, 64, 4, 128, 4000, 1500, 600)
# Helsinki-NLP/opus-mt-zh-en's shape, untrained: the few hundred steps two CPU cores afford in a test only teach a
# model this size the target's most frequent tokens, and then every source gets the same answer (measured), which
# would make a parity check trivial. Random weights drawn wider than transformers' default give each source its
# own answer, with a median gap of 0.2 nats between the two best first tokens: no ties either.
# Its SentencePiece models also read CC-CEDICT, so that the joint vocabulary passes 30 k pieces as opus-mt's does.
OPUS_MT = MarianSize(6, 6, 512, 8, 2048, 24000, 16000, 0, init_std=0.05, tokenizer_corpora=("cedict",))


def translation_pairs(data_dir: Path = DEFAULT_DATA_DIR) -> tuple[list[tuple[str, str]], list[str]]:
    """(training pairs zh, en; the held-out Chinese test sentences)."""
    train, test = read_translation(data_dir)
    return [(p.source, p.target) for p in train], [p.source for p in test]


def _spm(texts: list[str], vocab_size: int, prefix: Path) -> Path:
    import sentencepiece as spm

    corpus = prefix.with_suffix(".txt")
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=0.9995,
        hard_vocab_limit=False,
        bos_id=-1,
        eos_id=2,
        unk_id=1,
        pad_id=-1,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


def build_marian(
    folder: Path, size: MarianSize, pairs: list[tuple[str, str]], seed: int = 0, data_dir: Path = DEFAULT_DATA_DIR
) -> Path:
    """Train tokenizers and a MarianMTModel of `size` briefly on `pairs`, and save it to `folder`."""
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    random.seed(seed)
    torch.manual_seed(seed)
    extra = read_translation_extra(data_dir, size.tokenizer_corpora) if (data_dir / "translation").is_dir() else []
    texts = pairs + [(p.source, p.target) for p in extra]
    with tempfile.TemporaryDirectory() as work:
        source_spm = _spm([zh for zh, _ in texts], size.source_vocab, Path(work) / "source")
        target_spm = _spm([en for _, en in texts], size.target_vocab, Path(work) / "target")
        pieces: dict[str, int] = {"</s>": 0, "<unk>": 1}
        for path in (source_spm, target_spm):
            import sentencepiece as spm

            model = spm.SentencePieceProcessor(model_file=str(path))
            for i in range(model.get_piece_size()):
                if not (model.is_control(i) or model.is_unknown(i)):
                    pieces.setdefault(model.id_to_piece(i), len(pieces))
        pieces["<pad>"] = len(pieces)
        vocab = Path(work) / "vocab.json"
        vocab.write_text(json.dumps(pieces, ensure_ascii=False), encoding="utf-8")
        tokenizer = MarianTokenizer(str(source_spm), str(target_spm), str(vocab), source_lang="zh", target_lang="en")
        tokenizer.save_pretrained(folder)
    pad = pieces["<pad>"]
    config = MarianConfig(
        vocab_size=len(pieces),
        decoder_vocab_size=len(pieces),
        d_model=size.d_model,
        encoder_layers=size.encoder_layers,
        decoder_layers=size.decoder_layers,
        encoder_attention_heads=size.heads,
        decoder_attention_heads=size.heads,
        encoder_ffn_dim=size.ffn,
        decoder_ffn_dim=size.ffn,
        max_position_embeddings=512,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        activation_function="swish",
        dropout=0.1,
        init_std=size.init_std,
    )
    model = MarianMTModel(config)
    _train(model, tokenizer, pairs, size.train_steps)
    model.eval()
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad]],
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        max_length=512,
        num_beams=4,
        pad_token_id=pad,
    )
    model.save_pretrained(folder)
    return folder


def _train(model, tokenizer, pairs: list[tuple[str, str]], steps: int, batch: int = 32) -> None:
    """AdamW with a short warm-up and clipped gradients on short pairs: a model that answers each source its own
    way within a few hundred steps (a higher rate, or long pairs, first learn one answer for every source)."""
    short = [pair for pair in pairs if len(pair[0]) <= 16] or pairs

    def loss() -> torch.Tensor:
        rows = random.sample(short, min(batch, len(short)))
        inputs = tokenizer(
            [zh for zh, _ in rows], text_target=[en for _, en in rows], padding=True, truncation=True, max_length=24
        )
        labels = torch.tensor(inputs["labels"])
        labels[labels == model.config.pad_token_id] = -100
        return model(
            input_ids=torch.tensor(inputs["input_ids"]),
            attention_mask=torch.tensor(inputs["attention_mask"]),
            labels=labels,
        ).loss

    _optimize(model, steps, 1e-3, loss)


def _optimize(model, steps: int, lr: float, loss_of_a_batch) -> None:
    """`steps` AdamW steps on `loss_of_a_batch()` (a new batch each call), warm-up over 20, gradients clipped at 1."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    model.train()
    started = time.monotonic()
    for step in range(steps):
        loss = loss_of_a_batch()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 100 == 0 or step == steps - 1:
            print(f"  step {step + 1}/{steps} loss {loss.item():.2f} ({time.monotonic() - started:.0f} s)", flush=True)


# -- decoder-only chat models (Qwen2, Llama) ----------------------------------------------------------------------

CHATML = (  # Qwen2.5's template, its tool branches left out: a system turn of its own, then the turns
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (  # Llama 3's: the bos token in the text, headers around each role, eot after each turn
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim }}"
    "{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
CHAT_SPECIALS = {  # per template: its special tokens, the end of a turn first (the eos that ends an answer)
    "qwen2": ["<|im_end|>", "<|endoftext|>", "<|im_start|>"],
    "llama": ["<|eot_id|>", "<|end_of_text|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>"],
}


@dataclass(frozen=True)
class CausalSize:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int  # byte-level BPE tokens trained here (the config's vocab_size may be larger: `vocab_size`)
    train_steps: int
    vocab_size: int = 0  # the embedding's rows, when wider than the tokenizer (Qwen2.5 pads it to 151,936)
    rope_theta: float = 1e6
    tied: bool = True
    init_std: float = 0.02
    head_dim: int = 0  # 0: hidden / heads


TINY_QWEN2 = CausalSize(2, 64, 4, 2, 160, 3000, 400)
TINY_LLAMA = CausalSize(2, 64, 4, 1, 128, 3000, 400, rope_theta=5e5, tied=False)
# Qwen2.5-0.5B-Instruct's shape (24 layers, hidden 896, 14 heads, 2 key/value heads, 151,936 embedding rows,
# tied, rope_theta 1e6), untrained with wide random weights as OPUS_MT is: answers differ by prompt, no ties.
QWEN25_05B = CausalSize(24, 896, 14, 2, 4864, 8000, 0, vocab_size=151_936, init_std=0.05)


def chat_tokenizer(texts: list[str], vocab: int, specials: list[str]):
    """A byte-level BPE `tokenizers` file trained on `texts`, the chat template's special tokens first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def build_causal_lm(
    folder: Path,
    model_type: str,
    size: CausalSize,
    pairs: list[tuple[str, str]],
    seed: int = 0,
    rope_scaling: dict | None = None,
    instruction: str = "",
) -> Path:
    """A Qwen2ForCausalLM or LlamaForCausalLM folder as `save_pretrained` writes it (config, safetensors,
    generation config, tokenizer.json, tokenizer_config.json, chat_template.jinja), trained briefly to answer
    `instruction` with each pair's text in it by the pair's translation, in its chat template."""
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    from export.import_hf.decoder_only import INSTRUCTIONS
    from serving.text.chat import TEXT_FIELD

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    random.seed(seed)
    torch.manual_seed(seed)
    instruction = instruction or INSTRUCTIONS["translate"]
    specials = CHAT_SPECIALS[model_type]
    texts = [zh for zh, _ in pairs] + [en for _, en in pairs] + [instruction]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=chat_tokenizer(texts, size.vocab, specials),
        eos_token=specials[0],
        pad_token=specials[1],
        bos_token=specials[2] if model_type == "llama" else None,
        chat_template=CHATML if model_type == "qwen2" else LLAMA3,
    )
    ids = {token: fast.convert_tokens_to_ids(token) for token in specials}
    common = dict(
        vocab_size=size.vocab_size or len(fast),
        hidden_size=size.hidden,
        intermediate_size=size.ffn,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=size.tied,
        initializer_range=size.init_std,
        eos_token_id=ids[specials[0]],
        pad_token_id=ids[specials[1]],
    )
    rope = {"rope_type": "default", "rope_theta": size.rope_theta, **(rope_scaling or {})}
    if size.head_dim:
        common["head_dim"] = size.head_dim
    if model_type == "qwen2":
        config = Qwen2Config(**common, rope_parameters=rope)
        model = Qwen2ForCausalLM(config)
    else:
        config = LlamaConfig(**common, rope_parameters=rope, bos_token_id=ids[specials[2]])
        model = LlamaForCausalLM(config)

    def example(zh: str, en: str) -> tuple[list[int], int]:
        messages = [{"role": "user", "content": instruction.replace(TEXT_FIELD, zh)}]
        prompt = fast.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = fast(prompt, add_special_tokens=False)["input_ids"]
        answer = fast(en, add_special_tokens=False)["input_ids"] + [ids[specials[0]]]
        return prompt_ids + answer, len(prompt_ids)

    _train_causal(model, [example(zh, en) for zh, en in pairs if len(zh) <= 24], size.train_steps)
    model.eval()
    model.generation_config = GenerationConfig(
        eos_token_id=[ids[specials[0]], ids[specials[1]]],
        pad_token_id=ids[specials[1]],
        bos_token_id=ids[specials[2]] if model_type == "llama" else None,
        do_sample=False,
        max_new_tokens=64,
    )
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def _train_causal(model, examples: list[tuple[list[int], int]], steps: int, batch: int = 32) -> None:
    """AdamW on the answers' tokens (the prompt's are not predicted), as _train does for Marian."""
    pad = model.config.pad_token_id

    def loss() -> torch.Tensor:
        rows = random.sample(examples, min(batch, len(examples)))
        width = max(len(tokens) for tokens, _ in rows)
        ids = torch.full((len(rows), width), pad)
        labels = torch.full((len(rows), width), -100)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (tokens, prompt) in enumerate(rows):
            ids[i, : len(tokens)] = torch.tensor(tokens)
            labels[i, prompt : len(tokens)] = torch.tensor(tokens[prompt:])
            mask[i, : len(tokens)] = 1
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss

    _optimize(model, steps, 2e-3, loss)
