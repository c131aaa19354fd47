"""Negated clauses mined from the training reviews, as extra labelled training texts.

The review sets rarely negate a complaint (没出过问题, 一点也不咸): 问题, 失望, 毛病 occur mostly in
complaints, so an encoder trained on whole reviews reads 没有让我失望 as one. The reviews do hold such
clauses, buried in long texts. A clause is kept when its negator flips what the rest of it says by
itself: the n-gram teacher reads the words after the negator as a complaint but the review is clearly
positive (kept as positive), or the words as praise in a clearly negative review (kept as negative).
"Clearly" means the teacher agrees with the review's label at ≥ 0.8, which keeps clauses of mixed
reviews ("房间不大，但服务很好") out. Nothing here is written by hand except the negators and the
fixed words that only look negated (不错, 不少, 没想到).
Needs scikit-learn (the `train` extra).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from export.training.data import LabelledText, normalize_key

NEGATOR = re.compile(r"一点儿?[也都]不|从来没有?|从来不|从不|并没有|并不|毫不|绝不|没有|没|不")
# Words that start with a negator but negate nothing.
NOT_NEGATED = re.compile(
    r"不(错|少|断|过|然|同|仅|管|论|知|禁|住|如|久|一样|但|光|只|必|得不|停|好意思|愧|免|外乎|便|用说|算太|太多)"
    r"|没(想到|啥|什么|事|准)|差不多"
)
CLAUSE_BREAK = re.compile(r"[，。！？；,.!?;~～…、\s]+")
MIN_CLAUSE, MAX_CLAUSE = 3, 20  # characters
MAX_NEGATED = 6  # characters after the negator: a word or a short phrase, not a sentence
CLEAR = 0.8  # the teacher's probability of the review's own label
FLIPPED = 0.25  # the words after the negator alone: at most this probability of the review's label


def negated_clauses(text: str) -> list[tuple[str, str]]:
    """(clause, the words after its one negator) for each short clause with exactly one negator."""
    out = []
    for clause in CLAUSE_BREAK.split(text):
        if not MIN_CLAUSE <= len(clause) <= MAX_CLAUSE:
            continue
        match = NEGATOR.search(clause)
        if not match or NOT_NEGATED.match(clause, match.start()):
            continue
        rest = clause[match.end() :]
        if 1 <= len(rest) <= MAX_NEGATED and not NEGATOR.search(rest):
            out.append((clause, rest))
    return out


def mine(rows: Sequence[LabelledText], teacher, exclude: set[str] = frozenset()) -> list[LabelledText]:
    """Clauses of `rows` whose negator flips the reading of `teacher` (export.training.ngram_teacher.fit on `rows`),
    labelled with their review's label, deduplicated. A clause inside a text of `exclude` (the probes a test
    scores), or holding one, is left out, so that the probes measure what the model makes of a negation, not
    whether it has seen the phrase."""
    found = [(clause, rest, row) for row in rows for clause, rest in negated_clauses(row.text)]
    if not found:
        return []
    p_review = teacher.predict_proba([row.text for _, _, row in found])
    p_rest = teacher.predict_proba([rest for _, rest, _ in found])
    probes = [normalize_key(t) for t in exclude]
    out: dict[str, LabelledText] = {}
    for (clause, _, row), review, words in zip(found, p_review, p_rest, strict=True):
        key = normalize_key(clause)
        overlaps = any(key in probe or probe in key for probe in probes)
        if review[row.label] >= CLEAR and words[row.label] <= FLIPPED and not overlaps:
            out.setdefault(key, LabelledText(clause, row.label, "mined_negations"))
    return list(out.values())
