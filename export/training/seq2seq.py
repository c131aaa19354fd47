"""Translation (zh → en) and summarization (zh → zh headline): data → tokenizers → RoPE
encoder-decoder → BLEU/chrF or character ROUGE → checkpoint.

The two tasks differ only in the `Seq2SeqTask` row below; everything else is shared.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn
from tqdm import tqdm

from export.model.checkpoint import (
    CONFIG_FILE,
    METRICS_FILE,
    load_weights,
    read_json,
    round_to_stored_precision,
    save_checkpoint,
)
from export.model.config import ModelConfig
from export.model.reference_search import DEFAULT_SEARCH, ReferenceSearch
from export.model.transformer import Seq2Seq
from export.training.data import (
    Pair,
    normalize_key,
    read_summarization,
    read_translation,
    read_translation_extra,
    read_wmt,
    seeded_split,
)
from export.training.loop import TrainConfig, drop_tokens, length_batches, pad_batch, train
from export.training.scores import bleu_chrf, lead_baseline, rouge_chars
from serving.text.tokenizer import BOS_ID, EOS_ID, detokenize, load_tokenizer, train_or_resume, train_tokenizer

SOURCE_TOKENIZER, TARGET_TOKENIZER = "tokenizer.json", "target_tokenizer.json"


@dataclass(frozen=True)
class Seq2SeqTask:
    name: str
    reader: Callable[[Path], tuple[list[Pair], list[Pair]]]
    shared_vocab: bool  # summarization: one Chinese tokenizer for both sides
    lowercase_target: bool
    source_vocab: int
    target_vocab: int
    max_source_tokens: int
    max_target_tokens: int
    score: Callable[[list[str], list[str]], dict[str, float]]
    headline: str  # the score's key that --keep score selects by
    # more training pairs by corpus name (--corpora), and test sets beside the main one (scored too when present)
    extra_training: Callable[[Path, Sequence[str]], list[Pair]] | None = None
    extra_tests: Callable[[Path], dict[str, list[Pair]]] = lambda data_dir: {}


# What a checkpoint's metrics keep of the one it started from (--init): its command and epochs, and, recursively,
# where that one started from, so that a chain of runs stays traceable to its first command.
INHERITED_METRICS = ("command", "history", "initialized_from")

TASKS = {
    "translate": Seq2SeqTask(
        "translate",
        read_translation,
        False,
        False,
        4000,
        6000,
        64,
        48,
        score=bleu_chrf,
        headline="chrf",
        extra_training=read_translation_extra,
        extra_tests=lambda data_dir: {"wmt_newstest": pairs} if (pairs := read_wmt(data_dir)) else {},
    ),
    "summarize": Seq2SeqTask(
        "summarize", read_summarization, True, True, 6000, 6000, 160, 40, score=rouge_chars, headline="rougeL"
    ),
}


_SENTENCE_END = re.compile(r"[。！？!?；;]")


def first_sentence(text: str, max_chars: int = 30) -> str:
    """The text's first sentence, at most max_chars characters: the pseudo-summary of lead pre-training."""
    end = _SENTENCE_END.search(text)
    return (text[: end.start()] if end else text)[:max_chars]


def oversample(examples: list, head: int, weight: int) -> list:
    """The first ``head`` examples ``weight`` times, then the rest once."""
    if weight < 1:
        raise ValueError(f"the main set's weight must be at least 1, got {weight}")
    return examples[:head] * weight + examples[head:]


def encode_pairs(pairs: list[Pair], src: Tokenizer, tgt: Tokenizer, task: Seq2SeqTask) -> list[tuple[list, list]]:
    """(source ids + eos, target ids) per pair, truncated to the task's limits."""
    s = src.encode_batch([p.source for p in pairs], add_special_tokens=False)
    t = tgt.encode_batch([p.target for p in pairs], add_special_tokens=False)
    return [
        (a.ids[: task.max_source_tokens - 1] + [EOS_ID], b.ids[: task.max_target_tokens - 1])
        for a, b in zip(s, t, strict=True)
    ]


def seq2seq_loss(
    model: nn.Module, examples: list[tuple[list, list]], smoothing: float = 0.1, token_dropout: float = 0.0
) -> torch.Tensor:
    """Teacher forcing: decoder input [bos] + y, labels y + [eos]; padding ignored.

    token_dropout > 0 replaces that share of the source tokens and of the decoder's input tokens
    (never [bos]) by [UNK]; the labels stay intact.
    """
    src, src_mask = pad_batch([e[0] for e in examples])
    tgt_in, tgt_mask = pad_batch([[BOS_ID] + e[1] for e in examples])
    if token_dropout > 0:
        src = drop_tokens(src, src_mask, token_dropout)
        tgt_mask[:, 0] = 0
        tgt_in = drop_tokens(tgt_in, tgt_mask, token_dropout)
    labels, label_mask = pad_batch([e[1] + [EOS_ID] for e in examples])
    labels = labels.masked_fill(label_mask == 0, -100)
    logits = model(src, src_mask, tgt_in)  # [B, T, V]
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=smoothing)


@torch.no_grad()
def generate_texts(
    model: Seq2Seq,
    sources: list[list[int]],
    tgt_tokenizer: Tokenizer,
    max_new_tokens: int,
    num_beams: int,
    desc: str = "generate",
    batch_size: int = 64,
    decoding: ReferenceSearch = DEFAULT_SEARCH,
) -> list[str]:
    """Decode source ids with the PyTorch reference (greedy or beam), batched by length."""
    model.eval()
    out: list[str] = [""] * len(sources)
    batches = length_batches([len(s) for s in sources], 1 << 30, batch_size, None)
    for batch in tqdm(batches, desc=desc, unit="batch", dynamic_ncols=True):
        ids, mask = pad_batch([sources[i] for i in batch])
        seqs = decoding.generate(model, ids, mask, max_new_tokens, num_beams)
        for i, seq in zip(batch, seqs, strict=True):
            out[i] = detokenize(tgt_tokenizer, seq)
    return out


def run(
    task_name: str,
    data_dir: Path,
    out_dir: Path,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    state_path: Path | None = None,
    limit: int | None = None,
    command: str = "",
    eval_limit: int | None = None,
    lead_pretrain_minutes: float = 0.0,
    keep: str = "best",
    target_vocab: int | None = None,
    decoding: ReferenceSearch = DEFAULT_SEARCH,
    token_dropout: float = 0.0,
    corpora: Sequence[str] = (),
    main_weight: int = 1,
    init: Path | None = None,
) -> dict:
    """Train and evaluate; write the checkpoint folder; return the metrics.

    lead_pretrain_minutes > 0 first trains on (text → its first sentence) pairs made from the
    training texts ("Make Lead Bias in Your Favor", Zhu et al. 2019): copying a leading sentence is
    far easier to learn than a headline, and it teaches the decoder to attend to the source before
    the real summaries take over. Part of the time budget; skipped when resuming.

    keep="best" keeps the epoch with the lowest dev loss, keep="score" the one whose greedy dev
    outputs score best (chrF or ROUGE-L), keep="last" the final weights: with the
    learning rate annealed to 5%, the last weights can translate better although the loss of the
    dev references has crept up (an overconfident but more accurate model).

    token_dropout is word dropout on both sides of the training pairs (see seq2seq_loss).

    corpora names more training sets (translate: export.training.data.EXTRA_TRANSLATION_FILES). They join the training
    split only, so dev and test stay the main set's and scores compare with runs without them; a pair whose
    source is a dev or test sentence is dropped. main_weight > 1 repeats the main set's training pairs that many
    times in every epoch, so that a small in-domain set is not drowned by the extra text (the tokenizers still
    learn from each pair once).

    init names a checkpoint of the same task to start from: its architecture, tokenizers and weights
    (model_cfg then contributes only its dropout). The learning-rate schedule starts again from warm-up
    (a warm restart, Loshchilov & Hutter 2017), so a second budget continues a finished run; the
    metrics record the checkpoint's own command and epochs beside this run's. Its split seed must be this
    run's: another seed's dev split overlaps the training split the checkpoint learned from.

    decoding holds the beam length penalty (scores are sum log p / length ** length_penalty; above 1
    favours longer outputs) and no_repeat_ngram_size (n > 0: no n-gram twice in one output). They are
    evaluated here and stored in config.json, from where the exported generator takes them.
    Rerunning a finished run with other values only re-evaluates.
    """
    task = TASKS[task_name]
    if target_vocab:
        task = replace(task, target_vocab=target_vocab)
    pairs, test_pairs = task.reader(data_dir)
    train_pairs, dev_pairs = seeded_split(pairs, key=lambda p: p.source, fractions=(0.95, 0.05))
    main_count = len(train_pairs)
    if corpora:
        if task.extra_training is None:
            raise ValueError(f"{task.name} has no extra training corpora")
        held_out = {normalize_key(p.source) for p in dev_pairs + test_pairs}
        extra = [p for p in task.extra_training(data_dir, corpora) if normalize_key(p.source) not in held_out]
        print(f"{task.name}: {len(extra)} more training pairs from {', '.join(corpora)}")
        train_pairs = train_pairs + extra
    extra_tests = task.extra_tests(data_dir)
    if limit:
        train_pairs, dev_pairs, test_pairs = train_pairs[:limit], dev_pairs[: limit // 4], test_pairs[: limit // 4]
        extra_tests = {name: pairs[: limit // 4] for name, pairs in extra_tests.items()}
    if eval_limit:
        test_pairs = test_pairs[:eval_limit]
        extra_tests = {name: pairs[:eval_limit] for name, pairs in extra_tests.items()}
    print(f"{task.name}: train {len(train_pairs)}, dev {len(dev_pairs)}, test {len(test_pairs)}")

    folder = Path(state_path).parent if state_path else None
    initial = init_metrics = None
    if init is not None:
        initial, init_config, src_tok, tgt_tok = load(init)
        if init_config.get("task") != task.name:
            raise ValueError(f"--init {init} holds a {init_config.get('task')!r} checkpoint, not {task.name!r}")
        init_metrics = read_json(Path(init) / METRICS_FILE) if (Path(init) / METRICS_FILE).exists() else {}
        init_seed = init_metrics.get("splits", {}).get("seed", train_cfg.seed)
        if init_seed != train_cfg.seed:  # another seed's dev split overlaps the checkpoint's training split
            raise ValueError(f"--init {init} was trained on the split of --seed {init_seed}; give that seed")
        model_cfg = replace(initial.cfg, dropout=model_cfg.dropout)
        if folder:  # a resumed run must find the same tokenizers
            folder.mkdir(parents=True, exist_ok=True)
            src_tok.save(str(folder / SOURCE_TOKENIZER))
            tgt_tok.save(str(folder / TARGET_TOKENIZER))
    else:
        src_tok = train_or_resume(
            folder / SOURCE_TOKENIZER if folder else None,
            lambda: train_tokenizer(
                (t for p in train_pairs for t in ((p.source, p.target) if task.shared_vocab else (p.source,))),
                task.source_vocab,
            ),
        )
        tgt_tok = (
            src_tok
            if task.shared_vocab
            else train_or_resume(
                folder / TARGET_TOKENIZER if folder else None,
                lambda: train_tokenizer(
                    (p.target for p in train_pairs), task.target_vocab, lowercase=task.lowercase_target
                ),
            )
        )
    model_cfg.vocab_size = src_tok.get_vocab_size()
    model_cfg.tgt_vocab_size = tgt_tok.get_vocab_size()
    train_ex = oversample(
        encode_pairs(train_pairs, src_tok, tgt_tok, task), min(main_count, len(train_pairs)), main_weight
    )
    dev_ex = encode_pairs(dev_pairs, src_tok, tgt_tok, task)

    model = Seq2Seq(model_cfg)
    if initial is not None:
        model.load_state_dict(initial.state_dict())
        print(f"starting from {init} (its command: {init_metrics.get('command', 'unknown')})")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters, vocab {model_cfg.vocab_size} → {model_cfg.tgt_vocab_size}")

    def loss_fn(m: nn.Module, batch: list[int]) -> torch.Tensor:
        return seq2seq_loss(m, [train_ex[i] for i in batch], token_dropout=token_dropout)

    def evaluate(m: nn.Module) -> dict[str, float]:
        total, count = 0.0, 0
        for batch in length_batches([len(e[0]) for e in dev_ex], 8192, 128, None):
            total += seq2seq_loss(m, [dev_ex[i] for i in batch], smoothing=0.0).item() * len(batch)
            count += len(batch)
        scores = {"neg_dev_loss": round(-total / max(1, count), 4)}
        if keep == "score":
            hyps = generate_texts(
                m, [e[0] for e in dev_ex], tgt_tok, task.max_target_tokens, 1, "dev greedy", decoding=decoding
            )
            scores["dev_" + task.headline] = task.score(hyps, [p.target for p in dev_pairs])[task.headline]
        return scores

    history_lead: dict = {}
    if lead_pretrain_minutes > 0 and not (state_path and Path(state_path).exists()):  # a resumed run is past it
        lead_ex = encode_pairs([Pair(p.source, first_sentence(p.source)) for p in train_pairs], src_tok, tgt_tok, task)
        print(f"lead pre-training on {len(lead_ex)} (text → first sentence) pairs for {lead_pretrain_minutes} min")
        history_lead = train(
            model,
            [len(s) + len(t) for s, t in lead_ex],
            lambda m, batch: seq2seq_loss(m, [lead_ex[i] for i in batch]),
            replace(train_cfg, max_minutes=lead_pretrain_minutes, max_epochs=100),
            desc=f"{task.name} lead pre-training",
        )
    # the planned share, not the measured one, so that a resumed run gets the same budget
    train_cfg = replace(train_cfg, max_minutes=train_cfg.max_minutes - lead_pretrain_minutes)

    if keep == "score" and not dev_ex:
        raise ValueError("keep='score' selects by the dev split's score, but the dev split is empty")
    lengths = [len(s) + len(t) for s, t in train_ex]
    select = {"best": "neg_dev_loss", "score": "dev_" + task.headline}.get(keep)
    history = train(model, lengths, loss_fn, train_cfg, evaluate, select, state_path, desc=task.name)
    round_to_stored_precision(model)

    dev_scores = {}
    for label, beams in (("greedy", 1), ("beam4", 4)) if dev_ex else ():
        sources = [e[0] for e in dev_ex]
        hyps = generate_texts(model, sources, tgt_tok, task.max_target_tokens, beams, f"dev {label}", decoding=decoding)
        dev_scores[label] = task.score(hyps, [p.target for p in dev_pairs])

    def score_test_set(name: str, pairs: list[Pair]) -> tuple[dict[str, dict], dict[str, list]]:
        sources = [e[0] for e in encode_pairs(pairs, src_tok, tgt_tok, task)]
        references = [p.target for p in pairs]
        scores: dict[str, dict] = {}
        samples: dict[str, list] = {}
        for label, beams in (("greedy", 1), ("beam4", 4)):
            t0 = time.monotonic()
            hyps = generate_texts(
                model, sources, tgt_tok, task.max_target_tokens, beams, f"{name} {label}", decoding=decoding
            )
            scores[label] = {**task.score(hyps, references), "seconds": round(time.monotonic() - t0, 1)}
            samples[label] = [
                {"source": p.source, "reference": p.target, "output": h} for p, h in zip(pairs[:8], hyps[:8])
            ]
        return scores, samples

    scores, samples = score_test_set("test", test_pairs)
    references = [p.target for p in test_pairs]
    other_tests = {name: score_test_set(name, pairs)[0] for name, pairs in extra_tests.items()}
    if task.name == "summarize":
        texts = [p.source for p in test_pairs]
        scores["lead_baseline"] = task.score(lead_baseline(texts, references), references)
        scores["first_sentence_baseline"] = task.score([first_sentence(t) for t in texts], references)
    print({k: v for k, v in scores.items()})

    inherited = {key: init_metrics[key] for key in INHERITED_METRICS if key in (init_metrics or {})}
    metrics = {
        "task": task.name,
        "command": command,
        "parameters": n_params,
        "splits": {
            "train": len(train_pairs),
            "dev": len(dev_pairs),
            "test": len(test_pairs),
            **{name: len(pairs) for name, pairs in extra_tests.items()},
            "seed": train_cfg.seed,
        },
        **({"initialized_from": {"checkpoint": str(init), **inherited}} if init is not None else {}),
        "extra_corpora": list(corpora),
        "main_weight": main_weight,
        "train_examples_per_epoch": len(train_ex),
        "dev": dev_scores,
        "test": scores,
        **({"other_tests": other_tests} if other_tests else {}),
        "samples": samples,
        "history": history,
        "lead_pretraining": history_lead,
    }
    config = {
        "task": task.name,
        "architecture": "Seq2Seq",
        "model": asdict(model_cfg),
        "max_tokens": task.max_source_tokens,
        "shared_vocab": task.shared_vocab,
        **asdict(decoding),  # read back by ReferenceSearch.from_config
    }
    save_checkpoint(out_dir, model, config, metrics)
    src_tok.save(str(Path(out_dir) / SOURCE_TOKENIZER))
    tgt_tok.save(str(Path(out_dir) / TARGET_TOKENIZER))
    return metrics


def load(checkpoint_dir: Path) -> tuple[Seq2Seq, dict, Tokenizer, Tokenizer]:
    """(model in eval mode, config dict, source tokenizer, target tokenizer)."""
    config = read_json(Path(checkpoint_dir) / CONFIG_FILE)
    model = Seq2Seq(ModelConfig.from_dict(config["model"]))
    load_weights(checkpoint_dir, model)
    folder = Path(checkpoint_dir)
    return model, config, load_tokenizer(folder / SOURCE_TOKENIZER), load_tokenizer(folder / TARGET_TOKENIZER)
