"""Translate the text of an HTML fragment and keep its markup (DeepL's ``tag_handling=html``, LibreTranslate's
``format=html``): tags, attributes and comments are copied as they came, the contents of script and style are
left alone, and each run of text between two tags is translated as a text of its own (so a sentence that an
inline tag such as ``<b>`` cuts is translated in two pieces: the small models cannot move words across tags)."""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable, Sequence
from html.parser import HTMLParser

_RAW_TEXT = {"script", "style"}


class _Pieces(HTMLParser):
    """The fragment as a list of markup (copied) and text runs (translated), in order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.pieces: list[tuple[bool, str]] = []  # (is_text, content); text unescaped, markup verbatim
        self._raw_depth = 0

    def handle_starttag(self, tag: str, attrs: object) -> None:
        self.pieces.append((False, self.get_starttag_text() or ""))
        self._raw_depth += tag in _RAW_TEXT

    def handle_startendtag(self, tag: str, attrs: object) -> None:
        self.pieces.append((False, self.get_starttag_text() or ""))

    def handle_endtag(self, tag: str) -> None:
        self.pieces.append((False, f"</{tag}>"))
        self._raw_depth -= tag in _RAW_TEXT and self._raw_depth > 0

    def handle_data(self, data: str) -> None:
        self.pieces.append((self._raw_depth == 0, data))

    def handle_comment(self, data: str) -> None:
        self.pieces.append((False, f"<!--{data}-->"))

    def handle_decl(self, decl: str) -> None:
        self.pieces.append((False, f"<!{decl}>"))

    def handle_pi(self, data: str) -> None:
        self.pieces.append((False, f"<?{data}>"))


def text_runs(fragment: str) -> list[tuple[bool, str]]:
    parser = _Pieces()
    parser.feed(fragment)
    parser.close()
    return parser.pieces


def characters(fragment: str) -> int:
    """The characters that are translated (the text, not the markup): what a key is charged for."""
    return sum(len(text) for is_text, text in text_runs(fragment) if is_text)


async def translate_html(fragment: str, translate: Callable[[Sequence[str]], Awaitable[list[str]]]) -> str:
    """`fragment` with every text run that holds more than whitespace replaced by its translation, the spaces
    around it kept; ``translate`` answers a list of texts in one call."""
    runs = text_runs(fragment)
    wanted = [i for i, (is_text, text) in enumerate(runs) if is_text and text.strip()]
    answers = await translate([runs[i][1].strip() for i in wanted]) if wanted else []
    out = [text if not is_text else html.escape(text, quote=False) for is_text, text in runs]
    for i, answer in zip(wanted, answers):
        text = runs[i][1]
        lead, trail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()) :]
        out[i] = lead + html.escape(answer, quote=False) + trail
    return "".join(out)
