"""Long texts as windows of whole sentences, and one answer per text from its windows' answers.

An encoder reads at most its ``max_tokens`` (sentiment 128; the span scorer 158 between its [bos] and [eos]).
Cutting a longer text there would leave whatever comes after unread, a review's closing verdict included, so
such a text is read in windows: it is split into sentences (:func:`split`, mode ``"1"``), consecutive whole
sentences are packed greedily into windows of at most ``window`` tokens, and a sentence longer than a window is cut
after clause punctuation (:func:`fit`), or, for a clause longer than the window, at the window. Every window is a
contiguous run of the text's own tokens (the tokenizer is called once, on the whole text), so a text that fits one
window is read as one window of exactly the tokens a single read would give.

A text is read in at most :data:`MAX_WINDOWS` windows; the rest of a longer one is not read, and counts as
truncated, as does a clause cut at the window.

:func:`pool` turns a text's per-window logits into one answer (the sentiment front model's choice, measured on the
test sets' long reviews by ``python -m benchmarks.long_reviews``). No torch here: the front models import it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from serving.frontends.sentences import CLAUSE_PUNCTUATION, CLOSERS, Document, fit, split
from serving.text.tokenizer import UNK_ID

# A text is read in at most this many windows (sentiment: 4,096 tokens, about 7,000 Chinese characters of reviews): one
# request of 64 such texts is already 2,048 encoder rows. The longest test review has 1,329 tokens (11 windows).
MAX_WINDOWS = 32
_CLAUSE_CUT_ENDS = CLAUSE_PUNCTUATION + CLOSERS


@dataclass(frozen=True)
class Windows:
    """How a text's tokens are read: ``bounds[i]`` is window i's token range [start, end) in the text's tokens."""

    bounds: tuple[tuple[int, int], ...]
    truncated: bool  # not every token was read as part of a whole clause: a clause cut at the window, or the
    # windows past MAX_WINDOWS left out


def sentence_windows(
    text: str, offsets: Sequence[tuple[int, int]], window: int, max_windows: int = MAX_WINDOWS
) -> Windows:
    """The windows of a text whose tokens start and end at ``offsets`` (character offsets, as the tokenizer
    reports them). A text of at most ``window`` tokens is one window of all of them."""
    if window < 1:
        raise ValueError(f"window must be at least 1 token, got {window}")
    count = len(offsets)
    if count <= window:
        return Windows(((0, count),), False)
    # No more than max_windows full windows can be read: look no further (a 1 MiB text is 100 times that).
    readable = min(count, max_windows * window)
    units, cut = _units(text[: offsets[readable - 1][1]], offsets[:readable], window)
    bounds: list[tuple[int, int]] = []
    start = end = units[0][0]
    for unit_start, unit_end in units:
        if unit_end - start > window:  # this unit does not fit the current window: close it
            bounds.append((start, end))
            start = unit_start
        end = unit_end
    bounds.append((start, end))
    if len(bounds) > max_windows or readable < count:
        return Windows(tuple(bounds[:max_windows]), True)
    return Windows(tuple(bounds), cut)


def _units(text: str, offsets: Sequence[tuple[int, int]], window: int) -> tuple[list[tuple[int, int]], bool]:
    """The text's tokens as consecutive runs of at most ``window``: its sentences, a longer sentence's clauses
    (or pieces cut at the window), in order, together covering every token; and whether one was cut at the window.

    A token belongs to the sentence it starts in; the layout between two sentences (spaces, a stray quote)
    belongs to the sentence before it."""
    document = split(text, "1")
    starts: list[int] = []
    position = 0
    for gap, piece in zip(document.gaps, document.pieces, strict=False):
        position += len(gap)
        starts.append(position)
        position += len(piece)
    starts[0] = 0
    sentence_of = [max(0, bisect_right(starts, start) - 1) for start, _ in offsets]
    units: list[tuple[int, int]] = []
    cut = False
    first = 0
    while first < len(offsets):
        last = first
        while last < len(offsets) and sentence_of[last] == sentence_of[first]:
            last += 1
        if last - first <= window:
            units.append((first, last))
        else:
            sentence = sentence_of[first]
            segment_end = starts[sentence + 1] if sentence + 1 < len(starts) else len(text)
            pieces, hard = _clauses(
                text[starts[sentence] : segment_end], starts[sentence], offsets, first, last, window
            )
            units.extend(pieces)
            cut = cut or hard
        first = last
    return units, cut


def _clauses(
    segment: str, origin: int, offsets: Sequence[tuple[int, int]], first: int, last: int, window: int
) -> tuple[list[tuple[int, int]], bool]:
    """Tokens first..last-1 (one sentence, ``segment`` starting at character ``origin``) as runs of at most
    ``window`` tokens cut by :func:`fit`; and whether a cut fell inside a clause (at the window)."""
    ends = [end - origin for _, end in offsets[first:last]]
    token_ends: Callable[[Sequence[str]], list[list[int]]] = lambda pieces: [ends]  # noqa: E731 - one piece
    pieces = fit(Document((segment,), ("", "")), window, token_ends).pieces
    cuts: list[int] = []  # character offset (in segment) where each piece after the first starts
    hard = False
    position = 0
    for number, piece in enumerate(pieces):
        position = segment.find(piece, position)
        if number:
            cuts.append(position)
            hard = hard or pieces[number - 1][-1] not in _CLAUSE_CUT_ENDS
        position += len(piece)
    runs: list[tuple[int, int]] = []
    start = first
    for cut in cuts:
        end = start
        while end < last and offsets[end][0] - origin < cut:
            end += 1
        if end > start:
            runs.append((start, end))
        start = end
    runs.append((start, last))
    out: list[tuple[int, int]] = []
    for start, end in runs:  # fit keeps each piece within the window; this only guards the token bookkeeping
        for at in range(start, end, window):
            out.append((at, min(end, at + window)))
            hard = hard or (end - start > window)
    return out, hard


# --- pooling: one answer per text from its windows' logits -------------------------------------------------


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _as_logits(probs: np.ndarray) -> np.ndarray:
    """Probabilities as logits whose softmax gives them back."""
    return np.log(np.clip(probs, 1e-12, None))


def _first(logits: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    return logits[0]


def _last(logits: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    return logits[-1]


def _mean_logits(logits: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    return logits.mean(axis=0)


def _mean_probs(logits: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    return _as_logits(softmax(logits).mean(axis=0))


def _token_weighted(logits: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    weights = lengths / lengths.sum()
    return _as_logits((softmax(logits) * weights[:, None]).sum(axis=0))


def _most_confident(logits: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    return logits[int(softmax(logits).max(axis=-1).argmax())]


def _first_and_last(logits: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    return _as_logits(softmax(logits[[0, -1]]).mean(axis=0))


def _later_weighted(logits: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    weights = np.arange(1, len(logits) + 1, dtype=np.float64)
    weights /= weights.sum()
    return _as_logits((softmax(logits) * weights[:, None]).sum(axis=0))


Pooling = Callable[[np.ndarray, np.ndarray], np.ndarray]
POOLINGS: dict[str, Pooling] = {
    "first": _first,  # what the model read before windows: the first window only
    "mean_probs": _mean_probs,
    "mean_logits": _mean_logits,
    "last": _last,
    "token_weighted": _token_weighted,  # mean of probabilities weighted by each window's tokens
    "most_confident": _most_confident,  # the window whose answer is the most certain
    "first_and_last": _first_and_last,  # mean of the first and the last window's probabilities
    "later_weighted": _later_weighted,  # probabilities weighted 1, 2, 3, ...: a review's verdict tends to come last
}


def pool(logits: np.ndarray, lengths: Sequence[int], how: str) -> np.ndarray:
    """One text's logits [C] from its windows' logits [W, C] (``lengths``: each window's tokens). One window's
    logits are returned as they are, whatever the pooling: a text that fits one window answers as before."""
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 2 or len(logits) != len(lengths) or not len(logits):
        raise ValueError(f"logits must be [windows, classes] with one length per window, got {logits.shape}")
    if len(logits) == 1:
        return logits[0]
    return POOLINGS[how](logits, np.asarray(lengths, dtype=np.float64))


# --- the encoder's rows: every window of every text ---------------------------------------------------------


class TokenizedText(Protocol):
    """What a tokenizer gives for one text (``tokenizers.Encoding`` has both)."""

    ids: list[int]
    offsets: list[tuple[int, int]]


@dataclass(frozen=True)
class WindowRows:
    """The windows of a batch of texts as the encoder's rows, in text order."""

    rows: list[list[int]]  # token ids of each window
    owners: list[int]  # the text each row belongs to
    windows: list[Windows]  # per text, how it was read

    def lengths(self) -> list[int]:
        """Per text, the tokens given to the encoder (an empty text is one unknown token)."""
        counts = [0] * len(self.windows)
        for row, owner in zip(self.rows, self.owners, strict=True):
            counts[owner] += len(row)
        return counts


def window_rows(
    texts: Sequence[str],
    encodings: Sequence[TokenizedText],
    window: int,
    max_windows: int = MAX_WINDOWS,
    empty: Sequence[int] = (UNK_ID,),
) -> WindowRows:
    """Each text's windows (:func:`sentence_windows`) as rows of token ids; a text the tokenizer empties is the
    row ``empty``: one unknown token, as it always was, or none for a model whose rows are framed by special
    tokens anyway (an imported BERT reads such a text as [CLS] [SEP], as Hugging Face does)."""
    rows: list[list[int]] = []
    owners: list[int] = []
    read: list[Windows] = []
    for number, (text, encoding) in enumerate(zip(texts, encodings, strict=True)):
        windows = sentence_windows(text, encoding.offsets, window, max_windows)
        read.append(windows)
        for start, end in windows.bounds:
            rows.append(list(encoding.ids[start:end]) or list(empty))
            owners.append(number)
    return WindowRows(rows, owners, read)
