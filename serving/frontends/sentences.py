"""Documents as sentences: split a text into the pieces a sentence-trained model reads, and join the answers back
in the source's layout.

Our models were trained on single sentences: a paragraph sent as one text loses whole sentences (held-out Tatoeba
paragraphs of 8 sentences kept 0.48x the chrF of the same sentences one by one, docs/models.md). Like DeepL's
``split_sentences``, a text is cut into sentences first:

- ``"1"`` (the default): after Chinese or Western end punctuation (。！？!?, and … before a quote, a space or
  the end, with the closing quotes or brackets that follow) and at line breaks;
- ``"nonewlines"``: after end punctuation only; a line break inside a sentence stays in it;
- ``"0"``: not at all: the text is one piece, as the model always read it.

A sentence longer than the model's window is cut further after clause punctuation (，、；：), clauses packed
greedily up to the window, and only a clause longer than the window itself is cut at the window (:func:`fit`).

The answer keeps the layout: the line breaks between sentences (blank lines included) are kept, sentences on one
line are joined with one space (English puts one between sentences), and the clauses of a cut sentence too.

Plain rules, no model: on the team's Tatoeba paragraphs they recover every sentence boundary (docs/models.md), and
a sentence-boundary model (Argos Translate's stanza) would be a second network in the hot path. No torch here:
the front models import it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

SPLIT_MODES = ("1", "nonewlines", "0")
TokenEnds = Callable[[Sequence[str]], list[list[int]]]  # texts -> per text, each token's end offset (characters)

CLOSERS = "”’」』）)】》〉\"'"  # closing quotes and brackets, which stay with the punctuation before them
CLAUSE_PUNCTUATION = "，,、；;：:"  # where a sentence too long for the model's window may be cut
# A sentence: text up to its end punctuation (a run of it, then closing quotes/brackets), or up to the end.
# An ellipsis ends a sentence only before a closing quote, a space or the end (……然后 goes on).
_END = r"(?:[。！？!?]+|…+(?=[\s" + re.escape(CLOSERS) + r"]|$)|\.(?=\s|$))[" + re.escape(CLOSERS) + r"]*"
_SENTENCE = re.compile(r"[^。！？!?\n]*?(?:" + _END + r"|(?=\n)|$)", re.S)
_SENTENCE_NO_NEWLINES = re.compile(r"[^。！？!?]*?(?:" + _END + r"|$)", re.S)
# Where a long sentence may be cut: after clause punctuation (and closing quotes after it).
_CLAUSE_END = re.compile("[" + re.escape(CLAUSE_PUNCTUATION) + "]+[" + re.escape(CLOSERS) + "]*")


@dataclass(frozen=True)
class Document:
    """A text as pieces to translate and the layout around them.

    ``pieces[i]`` is the i-th piece's source text (stripped); ``gaps[i]`` the source between piece i-1 and piece
    i (``gaps[0]``: before the first, ``gaps[-1]``: after the last; len(gaps) == len(pieces) + 1). A gap of ""
    between two pieces means a cut inside one sentence.
    """

    pieces: tuple[str, ...]
    gaps: tuple[str, ...]

    def separator(self, i: int) -> str:
        """What the answer puts before piece i (i == len(pieces): after the last)."""
        gap = self.gaps[i]
        if self.verbatim:
            return gap
        breaks = gap.count("\n")
        if breaks:
            return "\n" * breaks
        return " " if 0 < i < len(self.pieces) else ""

    @property
    def verbatim(self) -> bool:
        """A text that was not split: its one piece is the whole text, nothing around it."""
        return len(self.pieces) == 1 and self.gaps == ("", "")

    def join(self, answers: Sequence[str]) -> str:
        """The answers of the pieces, in order, in the source's layout."""
        if len(answers) != len(self.pieces):
            raise ValueError(f"{len(self.pieces)} pieces, {len(answers)} answers")
        return "".join(self.separator(i) + answer for i, answer in enumerate(answers)) + self.separator(
            len(self.pieces)
        )

    def prefix(self, done: Sequence[str], partial: str = "") -> str:
        """The start of :meth:`join`'s answer that is certain when the first ``len(done)`` pieces are answered
        (``done``) and the next one's answer starts with ``partial``: what a stream may have sent by then."""
        text = "".join(self.separator(i) + answer for i, answer in enumerate(done))
        if len(done) == len(self.pieces):
            return text + self.separator(len(self.pieces))
        return text + self.separator(len(done)) + partial


def split(text: str, mode: str = "1") -> Document:
    """The text's sentences and the layout between them (see the module's docstring for the modes)."""
    if mode not in SPLIT_MODES:
        raise ValueError(f"split mode must be one of {', '.join(SPLIT_MODES)}, got {mode!r}")
    if mode == "0":
        return Document((text,), ("", ""))
    pattern = _SENTENCE if mode == "1" else _SENTENCE_NO_NEWLINES
    pieces: list[str] = []
    gaps: list[str] = []
    gap_start = 0
    for match in pattern.finditer(text):
        start, end = match.span()
        chunk = match.group()
        stripped = chunk.strip()
        if not stripped or not _readable(stripped):
            continue
        lead = len(chunk) - len(chunk.lstrip())
        gaps.append(text[gap_start : start + lead])
        pieces.append(stripped)
        gap_start = start + lead + len(stripped)
    if not pieces:  # nothing readable: the text as it is (the tokenizer reads it as one unknown token)
        return Document((text,), ("", ""))
    gaps.append(text[gap_start:])
    return Document(tuple(pieces), tuple(gaps))


def _readable(piece: str) -> bool:
    """A piece with more than punctuation and quotes in it (a stray "。" or "”" is layout, not a sentence)."""
    return any(ch.isalnum() for ch in piece)


def read(text: str, mode: str, window: int, token_ends: TokenEnds) -> Document:
    """The pieces a model with a ``window``-token input reads the text as: its sentences (:func:`split`), cut
    further where one is too long (:func:`fit`); mode "0": the text itself, whatever its length."""
    document = split(text, mode)
    return document if mode == "0" else fit(document, window, token_ends)


def fit(document: Document, window: int, token_ends: TokenEnds) -> Document:
    """The document with every piece longer than ``window`` tokens cut after clause punctuation, clauses packed
    greedily up to the window; a clause longer than the window is cut at the window. ``token_ends`` tokenizes
    (one batch call for all pieces)."""
    if window < 1:
        raise ValueError(f"window must be at least 1 token, got {window}")
    # A token covers at least one character, so only a piece of more than `window` characters can be too long:
    # the tokenizer runs on those alone (a typical sentence is shorter, and the front model encodes it anyway).
    long = [i for i, piece in enumerate(document.pieces) if len(piece) > window]
    ends: list[list[int]] = [[]] * len(document.pieces)
    for i, piece_ends in zip(long, token_ends([document.pieces[i] for i in long]) if long else []):
        ends[i] = piece_ends
    if all(len(e) <= window for e in ends):
        return document
    pieces: list[str] = []
    gaps: list[str] = []
    for piece, gap, piece_ends in zip(document.pieces, document.gaps, ends, strict=False):
        cuts = _cuts(piece, piece_ends, window) if len(piece_ends) > window else [len(piece)]
        start = 0
        for number, cut in enumerate(cuts):
            chunk = piece[start:cut]
            if chunk.strip():
                gaps.append(gap if number == 0 else "")
                pieces.append(chunk.strip())
            start = cut
    gaps.append(document.gaps[-1])
    return Document(tuple(pieces), tuple(gaps))


def _cuts(piece: str, ends: Sequence[int], window: int) -> list[int]:
    """Character offsets where the piece is cut (the last is its length), each run of tokens at most ``window``."""
    clause_ends = sorted({m.end() for m in _CLAUSE_END.finditer(piece)} | {len(piece)})
    cuts: list[int] = []
    first = 0  # index of the first token of the current chunk
    while first < len(ends):
        if len(ends) - first <= window:
            cuts.append(len(piece))
            break
        limit = ends[first + window - 1]  # the chunk may end here at the latest
        start = ends[first - 1] if first else 0
        fitting = [c for c in clause_ends if start < c <= limit]
        cut = fitting[-1] if fitting else limit
        cuts.append(cut)
        while first < len(ends) and ends[first] <= cut:
            first += 1
    return cuts
