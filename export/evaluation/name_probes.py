"""Do names come out right? Everyday sentences with place, country, language and person names.

The sentences are ours (none is a Tatoeba or WMT sentence); an output counts as right when it contains the English
name (any accepted spelling). The goal is GOAL of them with beam 4, the `translate` endpoint's default, which
tests/test_names.py checks through the served endpoint; greedy is reported beside it. To compare checkpoints:

    python -m export.evaluation.name_probes checkpoints/translate [runs/other/ck ...]
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

# The share of NAMED that must come out with the right name (beam 4).
GOAL = 0.9

NAMED = [
    ("北京是中国的首都。", r"Beijing"),
    ("我明年想去上海工作。", r"Shanghai"),
    ("东京的人很多。", r"Tokyo"),
    ("他住在纽约。", r"New York"),
    ("我的朋友来自德国。", r"German"),
    ("她会说法语。", r"French"),
    ("汤姆是我的朋友。", r"Tom"),
    ("玛丽喜欢喝茶。", r"Mary"),
    ("我们下个月去伦敦。", r"London"),
    ("巴黎很漂亮。", r"Paris"),
    ("日本的食物很好吃。", r"Japan"),
    ("他在美国学习。", r"America|United States|the US|USA|U\.S\."),
    ("我想学英语。", r"English"),
    ("约翰明天来。", r"John"),
    ("长城非常有名。", r"Great Wall"),
    ("我去过法国。", r"France"),
    ("意大利的比萨很有名。", r"Ital"),
    ("她在英国出生。", r"England|Britain|British|UK|United Kingdom"),
    ("俄罗斯很大。", r"Russia"),
    ("中国有很多人。", r"China|Chinese"),
    ("他会说日语。", r"Japanese"),
    ("我的老师是加拿大人。", r"Canad"),
    ("西班牙语很难吗？", r"Spanish"),
    ("香港的夜景很美。", r"Hong Kong"),
    ("我想去澳大利亚旅行。", r"Australia"),
    ("他从韩国来。", r"Korea"),
    ("德语不容易学。", r"German"),
    ("我在上海有一个朋友。", r"Shanghai"),
    ("北京的冬天很冷。", r"Beijing"),
    ("我们在东京见面吧。", r"Tokyo"),
    ("台湾有很多山。", r"Taiwan"),
    ("印度的人口很多。", r"India"),
    ("汤姆和玛丽结婚了。", r"Tom.*Mary|Mary.*Tom"),
]


def meets_goal(right: int) -> bool:
    """Whether `right` of the NAMED sentences coming out right reaches GOAL."""
    return right >= GOAL * len(NAMED)


def wrong_names(outputs: Sequence[str]) -> list[str]:
    """One line per output that lacks its name: "source → output (wanted pattern)"."""
    return [
        f"{sentence} → {output!r} (wanted {pattern})"
        for (sentence, pattern), output in zip(NAMED, outputs, strict=True)
        if not re.search(rf"\b(?:{pattern})", output)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m export.evaluation.name_probes", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("checkpoints", nargs="+", help="translate checkpoint folders")
    args = parser.parse_args(argv)
    from export.model.reference_search import ReferenceSearch
    from export.training import seq2seq
    from export.training.data import Pair

    for folder in args.checkpoints:
        model, config, source, target = seq2seq.load(folder)
        pairs = [Pair(sentence, "") for sentence, _ in NAMED]
        ids = [s for s, _ in seq2seq.encode_pairs(pairs, source, target, seq2seq.TASKS["translate"])]
        for label, beams in (("beam 4", 4), ("greedy", 1)):
            outputs = seq2seq.generate_texts(
                model, ids, target, 48, beams, f"names {label}", decoding=ReferenceSearch.from_config(config)
            )
            wrong = wrong_names(outputs)
            right = len(NAMED) - len(wrong)
            goal = "meets" if meets_goal(right) else "misses"
            print(f"{folder} ({label}): {right}/{len(NAMED)} names right ({goal} the {GOAL:.0%} goal)")
            print("".join(f"  {line}\n" for line in wrong), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
