"""Score sentiment checkpoints on the current test split: accuracy and macro-F1 per set, the negation probes, and
how many test texts are longer than the checkpoint reads (they are judged on their first tokens only).

The split comes from the data folder as it is now (all five sets), so an older checkpoint trained on fewer sets is
measured on the same texts as the shipped one:

    python -m export.evaluation.sentiment_scores checkpoints/sentiment [older/checkpoint ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from export.training.data import DEFAULT_DATA_DIR, sentiment_splits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m export.evaluation.sentiment_scores", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("checkpoints", nargs="+", type=Path, help="sentiment checkpoint folders")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="public datasets root")
    parser.add_argument("--seed", type=int, default=13, help="the split's seed (the training default)")
    args = parser.parse_args(argv)
    from export.training import sentiment

    test = sentiment_splits(args.data_dir, args.seed)[2]
    for folder in args.checkpoints:
        model, config, tokenizer = sentiment.load(folder)
        limit = config["max_tokens"]
        full = sentiment.encode(tokenizer, [r.text for r in test], 10**6)
        scores = sentiment.classification_metrics(test, sentiment.predict(model, [ids[:limit] for ids in full]))
        print(f"{folder}: test accuracy / macro-F1")
        for name, s in scores.items():
            longer = sum(len(ids) > limit for ids, r in zip(full, test) if name in ("all", r.source))
            print(f"  {name:18} {s['n']:6}  {s['accuracy']:.2%} / {s['f1_macro']:.2%}  ({longer} over {limit} tokens)")
        sentiment.probe_report(model, tokenizer, limit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
