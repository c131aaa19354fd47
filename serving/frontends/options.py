"""A request's options as a typed object, one class per kind of front model.

The task definition (`tasks/<task>.toml`) declares the options a request may carry; the front model's
``Options`` class says which of them it reads, with their Python types. Both must agree, which the front model
checks when it loads (:func:`check_options`): a definition that adds an option its front ignores, or a front that
reads one the definition lacks, fails at load with both names, not at the first request. Instances are frozen and
hashable: requests with equal options run together (one BLS call, one group).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields


@dataclass(frozen=True)
class NoOptions:
    """A task without options (sentiment)."""


@dataclass(frozen=True)
class GenerationOptions:
    """What the generator or the engine decodes with."""

    max_new_tokens: int
    num_beams: int


@dataclass(frozen=True)
class TranslateOptions(GenerationOptions):
    split_sentences: str  # how a text is cut into sentences (serving/frontends/sentences.py)


@dataclass(frozen=True)
class SummarizeOptions(GenerationOptions):
    mode: str  # "abstractive" (generated) or "extractive" (a span of the text)

    split_sentences = "0"  # not an option: a summary reads its text whole


@dataclass(frozen=True)
class AbstractiveOptions(GenerationOptions):
    """A summary that is always generated (a chat model's): no mode to choose."""

    split_sentences = "0"  # not an option: a summary reads its text whole


EngineOptions = TranslateOptions | SummarizeOptions | AbstractiveOptions  # what the engine's front model reads


def check_options(options_type: type, keywords: list[str], where: str) -> None:
    """`options_type` takes exactly what the definition declares: every keyword is a field, and every field
    without a default is declared."""
    names = {field.name for field in fields(options_type)}
    unknown = [keyword for keyword in keywords if keyword not in names]
    required = [f.name for f in fields(options_type) if f.default is MISSING and f.name not in keywords]
    if unknown or required:
        raise ValueError(
            f"{where}: the definition's options {keywords} do not fit {options_type.__name__} "
            f"(not read by the front model: {unknown or 'none'}; read but not declared: {required or 'none'})"
        )
