"""A chat model's prompt: its chat template rendered as transformers renders it (`apply_chat_template`), on the
server, in jinja2's sandbox.

A checkpoint's template is code from whoever published it, so it runs in `ImmutableSandboxedEnvironment` with what
transformers gives a template and nothing more: `trim_blocks`/`lstrip_blocks`, the `loopcontrols` extension, a
`tojson` filter that keeps non-ASCII text, `raise_exception` and `strftime_now`, the special tokens by name
(`bos_token`, `eos_token`, ...), `messages`, `add_generation_prompt`, and no tools or documents.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

TEXT_FIELD = "{text}"  # where an instruction takes the user's text


class PromptError(ValueError):
    """A template or an instruction that cannot make a prompt; the message says why."""


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@dataclass(frozen=True)
class ChatPrompt:
    """Turns a text into the prompt a chat model answers: the instruction with the text in its place, as the
    user's message (after a system message when there is one), then the template's generation prompt."""

    template: str
    instruction: str  # holds TEXT_FIELD once
    system: str = ""
    special_tokens: tuple[tuple[str, str], ...] = ()  # ("bos_token", "<|begin_of_text|>"), ...

    def __post_init__(self) -> None:
        if self.instruction.count(TEXT_FIELD) != 1:
            raise PromptError(f"the instruction must hold {TEXT_FIELD} exactly once, got {self.instruction!r}")
        from jinja2 import TemplateSyntaxError, ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols])
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = _strftime_now
        try:
            compiled = environment.from_string(self.template)
        except TemplateSyntaxError as err:
            raise PromptError(f"the chat template does not parse: {err}") from None
        object.__setattr__(self, "_compiled", compiled)

    def messages(self, text: str) -> list[dict[str, str]]:
        user = {"role": "user", "content": self.instruction.replace(TEXT_FIELD, text)}
        return [{"role": "system", "content": self.system}, user] if self.system else [user]

    def render(self, messages: list[dict[str, str]]) -> str:
        """The template's text for a conversation, ending with the assistant's turn opened."""
        compiled = self._compiled  # type: ignore[attr-defined]
        return compiled.render(
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=True,
            **dict(self.special_tokens),
        )

    def __call__(self, text: str) -> str:
        return self.render(self.messages(text))
