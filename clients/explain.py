"""What the explain models (`translate_explain`, `sentiment_explain`) return, and how to read it.

Each answer holds the endpoint's usual result plus the tokens the model read and its attention matrices,
cut to the text's own length (the server pads the texts of one request to the longest; a text's length
is its number of non-empty tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from numpy.typing import NDArray

from .endpoints import Endpoint, InferResultLike, as_text, endpoint, options_of, output_rows, text_decoder
from .task_definitions import get as get_task


@dataclass(frozen=True)
class TranslationAlignment:
    """`translate_explain` for one text.

    attention: [layers, target, source], the decoder's cross-attention averaged over heads; row t says which
    source tokens the model attended to while producing target token t, and sums to 1.
    """

    translation: str
    source_tokens: list[str]
    target_tokens: list[str]
    attention: NDArray[Any]

    def strongest_sources(self, layer: int = -1) -> list[tuple[str, str]]:
        """(target token, the source token it attended to most) in one layer, the last by default."""
        picks = self.attention[layer].argmax(axis=-1)
        return [(target, self.source_tokens[int(j)]) for target, j in zip(self.target_tokens, picks)]


@dataclass(frozen=True)
class SentimentAttention:
    """`sentiment_explain` for one text.

    attention: [layers, tokens, tokens], self-attention per encoder layer averaged over heads (rows sum to 1);
    rollout: [tokens], attention rollout from the mean-pooled position the classifier reads (sums to 1).
    """

    label: str
    score: float
    tokens: list[str]
    attention: NDArray[Any]
    rollout: NDArray[Any]


def token_rows(result: InferResultLike, name: str, rows: int) -> list[list[str]]:
    """A padded BYTES [N, width] output → one token list per text, without the "" padding."""
    return [[as_text(t) for t in row if as_text(t) != ""] for row in output_rows(result, name, rows)]


def decode_translation_alignment(result: InferResultLike, rows: int) -> list[TranslationAlignment]:
    translations = text_decoder("TRANSLATION")(result, rows)
    sources = token_rows(result, "SOURCE_TOKENS", rows)
    targets = token_rows(result, "TARGET_TOKENS", rows)
    attention = output_rows(result, "ATTENTION", rows)  # [N, L, T, S]
    return [
        TranslationAlignment(text, src, tgt, attention[i, :, : len(tgt), : len(src)])
        for i, (text, src, tgt) in enumerate(zip(translations, sources, targets))
    ]


def decode_sentiment_attention(result: InferResultLike, rows: int) -> list[SentimentAttention]:
    verdicts = endpoint("sentiment").decode(result, rows)
    tokens = token_rows(result, "TOKENS", rows)
    attention = output_rows(result, "ATTENTION", rows)  # [N, L, S, S]
    rollout = output_rows(result, "ROLLOUT", rows)  # [N, S]
    return [
        SentimentAttention(v.label, v.score, toks, attention[i, :, : len(toks), : len(toks)], rollout[i, : len(toks)])
        for i, (v, toks) in enumerate(zip(verdicts, tokens))
    ]


# How to read each explain twin's answer; its model name, outputs and options come from the task definition.
DECODERS: Mapping[str, Callable[[InferResultLike, int], list[Any]]] = {
    "translate": decode_translation_alignment,
    "sentiment": decode_sentiment_attention,
}


def explain_endpoint(task: str) -> Endpoint[Any]:
    if task not in DECODERS or get_task(task).explain is None:
        raise ValueError(f"explain is available for {' and '.join(DECODERS)}, got {task!r}")
    definition = get_task(task)
    twin = definition.explain
    return Endpoint(twin.name, tuple(t.name for t in twin.outputs), DECODERS[task], options_of(definition))


def explain_options(options: Mapping[str, int | str | None]) -> dict[str, int | str]:
    """Only the options that were set: `sentiment` has none, and naming one for it is a TypeError."""
    return {keyword: value for keyword, value in options.items() if value is not None}
