"""Training CLI: `python -m export.train {sentiment,translate,summarize} --data-dir ../shared/data`.

Each run writes a checkpoint folder (model.safetensors, config.json, tokenizer files,
metrics.json with the test scores and this command) and keeps a resumable state file: run the
same command again after an interruption and it continues from the last finished epoch.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from export.model.config import ModelConfig
from export.training.data import DEFAULT_DATA_DIR
from export.training.loop import TrainConfig

# Per-task defaults, sized to train on 2 CPU cores within the stated budget.
DEFAULTS = {
    "sentiment": dict(minutes=26.0, epochs=6, layers=4, decoder_layers=0, lr=1e-3, batch_tokens=4096),
    "translate": dict(minutes=55.0, epochs=30, layers=3, decoder_layers=3, lr=1e-3, batch_tokens=6144),
    "summarize": dict(minutes=55.0, epochs=30, layers=3, decoder_layers=3, lr=7e-4, batch_tokens=8192),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m export.train",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("task", choices=sorted(DEFAULTS), help="which model to train")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="public datasets root")
    p.add_argument("--out", type=Path, help="checkpoint folder (default: checkpoints/<task>)")
    p.add_argument("--state", type=Path, help="resumable training state (default: runs/<task>/state.pt)")
    p.add_argument("--minutes", type=float, help="wall-clock training budget (task default)")
    p.add_argument("--epochs", type=int, help="maximum epochs (task default)")
    p.add_argument("--lr", type=float, help="peak learning rate (task default)")
    p.add_argument("--batch-tokens", type=int, help="padded tokens per batch (task default)")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, help="encoder layers (task default)")
    p.add_argument("--decoder-layers", type=int, help="decoder layers, seq2seq tasks (task default)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--vocab-size", type=int, default=8000, help="sentiment tokenizer size")
    p.add_argument(
        "--tokenizer",
        choices=["chars", "words"],
        default="chars",
        help="sentiment: one token per Chinese character, or learned multi-character pieces",
    )
    p.add_argument(
        "--pretrain-minutes",
        type=float,
        default=0.0,
        help="sentiment: first pre-train the encoder with masked tokens on the training texts (part of --minutes)",
    )
    p.add_argument(
        "--token-dropout",
        type=float,
        default=0.0,
        help="share of training tokens replaced by [UNK] (word dropout); seq2seq: source and decoder input",
    )
    p.add_argument(
        "--negation-templates",
        action="store_true",
        help="sentiment: add synthetic negation reviews (不差 → positive, 一点也不好 → negative) to training",
    )
    p.add_argument(
        "--mined-negations",
        action="store_true",
        help="sentiment: add negated clauses mined from the training reviews (export/training/negation_mining.py)",
    )
    p.add_argument(
        "--distill",
        type=float,
        default=0.0,
        help="sentiment: weight of an n-gram teacher's soft labels in the training targets (0 = labels only; "
        "needs scikit-learn, the `train` extra)",
    )
    p.add_argument(
        "--lead-pretrain-minutes",
        type=float,
        default=0.0,
        help="summarize: first train on (text → its first sentence) pairs for this long (part of --minutes)",
    )
    p.add_argument(
        "--keep",
        choices=["best", "score", "last"],
        default="best",
        help="translate/summarize: the weights of the epoch with the lowest dev loss, of the epoch with the best "
        "dev score of greedy outputs (chrF / ROUGE-L, decoded after every epoch), or the last weights",
    )
    p.add_argument(
        "--target-vocab",
        type=int,
        help="translate: English tokenizer size (default 6000); smaller pieces generalize better on little data",
    )
    p.add_argument(
        "--corpora",
        default="",
        help="translate: more training sets from <data-dir>/translation/extra, comma-separated: "
        "msctd (subtitles, NON-COMMERCIAL use only), aic2017, bmeld, microtopia, cedict (dictionary words "
        "and names), cedict_names (its proper nouns only: places, countries, languages, people); dev and test stay "
        "Tatoeba's",
    )
    p.add_argument(
        "--main-weight",
        type=int,
        default=1,
        help="translate with --corpora: repeat the Tatoeba training pairs this many times per epoch, so the "
        "in-domain set is not drowned by the extra corpora (default 1)",
    )
    p.add_argument(
        "--copy",
        action="store_true",
        help="summarize: a pointer-generator decoder that can copy source tokens into the summary",
    )
    p.add_argument(
        "--extractive",
        action="store_true",
        help="summarize: train the extractive span scorer (export/training/extractive.py) instead of the generator, "
        "starting from the encoder of the summarize checkpoint in --init; default --out "
        "checkpoints/summarize/extractor",
    )
    p.add_argument(
        "--init",
        type=Path,
        help="translate/summarize: continue from this checkpoint of the same task (its architecture, tokenizers "
        "and weights; the learning rate warms up again), e.g. to spend a second budget on a finished run. "
        "summarize --extractive: the summarize checkpoint whose encoder and tokenizer the scorer starts from "
        "(default there: checkpoints/summarize)",
    )
    p.add_argument(
        "--length-penalty",
        type=float,
        default=1.0,
        help="translate/summarize: beam-search length penalty (score = log p / length ** L; L > 1 favours longer "
        "outputs), evaluated and exported with the model",
    )
    p.add_argument(
        "--no-repeat-ngram",
        type=int,
        default=0,
        help="translate/summarize: greedy and beam outputs never repeat an n-gram of this many tokens "
        "(0 = off), evaluated and exported with the model",
    )
    p.add_argument(
        "--ema",
        type=float,
        default=0.0,
        help="evaluate and keep an exponential moving average of the weights with this decay per step "
        "(e.g. 0.999; 0 = the weights as trained)",
    )
    p.add_argument("--max-tokens", type=int, default=128, help="sentiment texts are truncated to this")
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores)")
    p.add_argument(
        "--bf16",
        action="store_true",
        help="train under bfloat16 autocast (weights, optimizer and evaluation stay fp32); about 1.5x faster on "
        "CPUs with AVX512-BF16 or AMX, slower elsewhere",
    )
    p.add_argument("--limit", type=int, help="use only this many training examples (smoke tests)")
    p.add_argument("--eval-limit", type=int, help="score only this many test examples (smoke tests)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    command = shlex.join(["python", "-m", "export.train", *argv])
    defaults = DEFAULTS[args.task]
    pick = lambda name: defaults[name] if getattr(args, name) is None else getattr(args, name)  # noqa: E731
    out = args.out or Path("checkpoints") / args.task
    state = args.state or Path("runs") / args.task / "state.pt"
    model_cfg = ModelConfig(
        d_model=args.d_model,
        n_heads=args.heads,
        n_layers=pick("layers"),
        n_decoder_layers=pick("decoder_layers"),
        d_ff=args.d_ff,
        dropout=args.dropout,
        copy=args.copy,
    )
    train_cfg = TrainConfig(
        max_epochs=pick("epochs"),
        max_minutes=pick("minutes"),
        lr=pick("lr"),
        batch_tokens=pick("batch_tokens"),
        seed=args.seed,
        threads=args.threads,
        bf16=args.bf16,
        ema=args.ema,
    )
    if args.copy and args.task != "summarize":
        build_parser().error("--copy applies to summarize only (it needs one vocabulary for text and summary)")
    if args.target_vocab is not None and args.task != "translate":
        build_parser().error("--target-vocab applies to translate only (summarize shares one vocabulary)")
    corpora = [name.strip() for name in args.corpora.split(",") if name.strip()]
    if corpora and args.task != "translate":
        build_parser().error("--corpora applies to translate only")
    if args.main_weight != 1 and not corpora:
        build_parser().error("--main-weight weighs the main set against --corpora; give --corpora too")
    if args.main_weight < 1:
        build_parser().error(f"--main-weight must be at least 1, got {args.main_weight}")
    if args.extractive and args.task != "summarize":
        build_parser().error("--extractive applies to summarize only")
    if args.init is not None and args.task == "sentiment":
        build_parser().error("--init applies to translate and summarize only")
    if args.extractive:
        from export.training import extractive

        extractive.run(
            args.data_dir,
            args.out or Path("checkpoints") / "summarize" / extractive.EXTRACTOR_FOLDER,
            args.init or Path("checkpoints") / "summarize",
            train_cfg,
            args.state or Path("runs") / "summarize-extractor" / "state.pt",
            args.limit,
            command,
        )
    elif args.task == "sentiment":
        from export.training import sentiment

        sentiment.run(
            args.data_dir,
            out,
            model_cfg,
            train_cfg,
            args.vocab_size,
            args.max_tokens,
            state,
            args.limit,
            command,
            cjk_chars=args.tokenizer == "chars",
            pretrain_minutes=args.pretrain_minutes,
            token_dropout=args.token_dropout,
            negation_templates=args.negation_templates,
            mined_negations=args.mined_negations,
            distill=args.distill,
        )
    else:
        from export.model.reference_search import ReferenceSearch
        from export.training import seq2seq

        seq2seq.run(
            args.task,
            args.data_dir,
            out,
            model_cfg,
            train_cfg,
            state,
            args.limit,
            command,
            args.eval_limit,
            lead_pretrain_minutes=args.lead_pretrain_minutes,
            keep=args.keep,
            target_vocab=args.target_vocab,
            decoding=ReferenceSearch(args.length_penalty, args.no_repeat_ngram),
            token_dropout=args.token_dropout,
            corpora=corpora,
            main_weight=args.main_weight,
            init=args.init,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
