"""The candidate spans of an extractive summary: runs of whole clauses, at most MAX_SPAN_CHARS characters.

A headline of the LCSTS kind is about 18 characters; a clause (text up to a comma, colon or sentence end) is
shorter, a sentence often longer. Picking the best run of clauses of up to 30 characters from the texts of
`lcsts_val.tsv` would score 36.9 character ROUGE-L, the best whole sentence 27.4, the first sentence 19.8.

Training (export/training/extractive.py) and the summarize front model both build the scorer's input here
(:func:`candidates`), so the scorer ranks exactly the spans it learned to rank. A text longer than the scorer reads
is served in windows of whole sentences (serving/frontends/windows.py), each scored on its own as
:func:`window_candidates` builds it; training never sees those. No torch: the front models import it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from serving.text.tokenizer import BOS_ID, EOS_ID, UNK_ID

MAX_SPAN_CHARS = 30
# A clause: text up to and including its closing punctuation (and a closing quote right after it). The span scorer
# was trained on these clauses (export/training/extractive.py), so they are its own: unlike the sentence splitter's
# (serving/frontends/sentences.py) they end at line breaks and not at 、, which joins the items of a list.
_CLAUSE = re.compile(r"[^。！？!?；;，,：:\n]+[。！？!?；;，,：:\n]*[”」』\"')）]?")
_EDGES = " \t\r\n。！？!?；;，,：:、…"


def clauses(text: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of the text's clauses, in order; whitespace-only pieces skipped."""
    return [m.span() for m in _CLAUSE.finditer(text) if m.group().strip(_EDGES)]


def spans(text: str, limit: int | None = None) -> list[tuple[int, int]]:
    """Every run of consecutive clauses that ends by `limit` (the end of what the model read; default the whole
    text) and is at most MAX_SPAN_CHARS long; a single longer clause is a span of its own."""
    limit = len(text) if limit is None else limit
    return runs([c for c in clauses(text) if c[1] <= limit] or [(0, limit)])


def runs(pieces: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Every run of consecutive pieces (clauses, in order) of at most MAX_SPAN_CHARS; a longer piece alone."""
    out: list[tuple[int, int]] = []
    for i, (start, _) in enumerate(pieces):
        for _, end in pieces[i:]:
            if out and out[-1][0] == start and end - start > MAX_SPAN_CHARS:
                break
            out.append((start, end))
    return out


def span_text(text: str, span: tuple[int, int]) -> str:
    """The span as a headline: without the punctuation and spaces at its edges."""
    return text[span[0] : span[1]].strip(_EDGES)


def span_tokens(offsets: Sequence[tuple[int, int]], candidates: Sequence[tuple[int, int]]) -> list[list[int]]:
    """For each span, the indices of the tokens that start inside it (`offsets`: each token's character
    offsets, as the tokenizer reports them)."""
    return [[i for i, (s, _) in enumerate(offsets) if start <= s < end] for start, end in candidates]


@dataclass(frozen=True)
class Candidates:
    """The scorer's input for one text and the spans it ranks."""

    ids: list[int]  # [bos] + the text's tokens (at most max_tokens - 2) + [eos]
    positions: list[list[int]]  # per span, the positions of its tokens in ids
    texts: list[str]  # per span, its text as a headline
    truncated: bool  # the text had more tokens than the scorer reads


def candidates(text: str, ids: Sequence[int], offsets: Sequence[tuple[int, int]], max_tokens: int) -> Candidates:
    """`ids` and `offsets`: the text's tokens and their character offsets, as the tokenizer gives them."""
    keep = max_tokens - 2
    offsets = offsets[:keep]
    cut = spans(text, offsets[-1][1] if offsets else len(text))
    kept = [(c, t) for c, t in zip(cut, span_tokens(offsets, cut), strict=True) if t]
    kept = kept or [((0, len(text)), [0])]  # no token starts in any span (e.g. a text the tokenizer empties)
    return Candidates(
        ids=[BOS_ID, *(list(ids[:keep]) or [UNK_ID]), EOS_ID],
        positions=[[i + 1 for i in t] for _, t in kept],
        texts=[span_text(text, c) or text.strip() for c, _ in kept],
        truncated=len(ids) > keep,
    )


def window_candidates(
    text: str, ids: Sequence[int], offsets: Sequence[tuple[int, int]], first: int, last: int
) -> Candidates:
    """The scorer's input for one window of a longer text: its tokens ``first``..``last - 1`` (whole sentences,
    at most max_tokens - 2 of them: serving/frontends/windows.py) between [bos] and [eos], and the spans that lie
    inside the window (a clause that crosses the window's edge is cut there). Like :func:`candidates` for a text
    that starts at the window and ends with it."""
    if not 0 <= first < last <= len(ids):
        raise ValueError(f"window [{first}, {last}) is not inside the text's {len(ids)} tokens")
    start, end = offsets[first][0], offsets[last - 1][1]
    pieces = [(max(s, start), min(e, end)) for s, e in clauses(text) if s < end and e > start]
    cut = runs(pieces or [(start, end)])
    window_offsets = offsets[first:last]
    kept = [(c, t) for c, t in zip(cut, span_tokens(window_offsets, cut), strict=True) if t]
    kept = kept or [((start, end), [0])]
    return Candidates(
        ids=[BOS_ID, *ids[first:last], EOS_ID],
        positions=[[i + 1 for i in t] for _, t in kept],
        texts=[span_text(text, c) or text[start:end].strip() for c, _ in kept],
        truncated=False,
    )
