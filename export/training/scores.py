"""Text-generation scores: sacreBLEU/chrF for translation, character ROUGE for Chinese summaries."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def bleu_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    import sacrebleu

    bleu = sacrebleu.corpus_bleu(list(hypotheses), [list(references)])
    chrf = sacrebleu.corpus_chrf(list(hypotheses), [list(references)])
    return {"bleu": round(bleu.score, 2), "chrf": round(chrf.score, 2)}


def _chars(text: str) -> list[str]:
    return [c for c in text if not c.isspace()]


def _ngram_f1(hyp: list[str], ref: list[str], n: int) -> float:
    h = Counter(tuple(hyp[i : i + n]) for i in range(len(hyp) - n + 1))
    r = Counter(tuple(ref[i : i + n]) for i in range(len(ref) - n + 1))
    overlap = sum((h & r).values())
    if not h or not r or not overlap:
        return 0.0
    p, rc = overlap / sum(h.values()), overlap / sum(r.values())
    return 2 * p * rc / (p + rc)


def _lcs(a: list[str], b: list[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(hypothesis: str, reference: str) -> float:
    """Character ROUGE-L F1 of one text, in [0, 1]."""
    h, r = _chars(hypothesis), _chars(reference)
    lcs = _lcs(h, r)
    return 2 * lcs / (len(h) + len(r)) if lcs else 0.0


def rouge_chars(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean character-level ROUGE-1/2/L F1 (×100), the usual measure for Chinese (LCSTS)."""
    r1 = r2 = rl = 0.0
    for hyp, ref in zip(hypotheses, references, strict=True):
        h, r = _chars(hyp), _chars(ref)
        r1 += _ngram_f1(h, r, 1)
        r2 += _ngram_f1(h, r, 2)
        lcs = _lcs(h, r)
        if lcs:
            p, rc = lcs / len(h), lcs / len(r)
            rl += 2 * p * rc / (p + rc)
    n = max(1, len(references))
    return {"rouge1": round(100 * r1 / n, 2), "rouge2": round(100 * r2 / n, 2), "rougeL": round(100 * rl / n, 2)}


def lead_baseline(texts: Sequence[str], references: Sequence[str]) -> list[str]:
    """The first N characters of each text, N = mean reference length (in characters)."""
    n = round(sum(len(_chars(r)) for r in references) / max(1, len(references)))
    return ["".join(_chars(t)[:n]) for t in texts]
