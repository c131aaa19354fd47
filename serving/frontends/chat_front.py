"""`translate` or `summarize` by a decoder-only chat model (Qwen2, Llama: export/import_hf/decoder_only.py) on the
continuous-batching engine, and the streaming twins.

Everything but the prompt is EngineFront's: documents read sentence by sentence (translate), each piece a row of
the engine, limits, cancellation, streams. Each piece becomes the prompt the model was tuned to answer: the task's
`[prompt]` instruction with the piece in it, rendered with the checkpoint's chat template (serving/text/chat.py),
tokenized by the checkpoint's own tokenizer.json; the engine prefills it and continues it. The answer is the
generated tokens decoded, special tokens skipped, as transformers' `decode(skip_special_tokens=True)`.

A piece longer than the window is cut at a token end: the window is what the served context (config.json's
`context`) leaves after the template's own tokens and the largest MAX_NEW_TOKENS the task allows, and at most
half the context.
"""

from __future__ import annotations

from tokenizers import Tokenizer

from serving.frontends.base import BatchTokenizer, InputError
from serving.frontends.engine_front import EngineFront
from serving.frontends.options import AbstractiveOptions, TranslateOptions
from serving.text.chat import ChatPrompt

SMALLEST_WINDOW = 16  # tokens of text a prompt must leave room for


class ChatFront(EngineFront):
    TARGET_TOKENIZER = "tokenizer.json"  # a chat model reads and writes with one tokenizer

    def source_tokenizer(self) -> BatchTokenizer:
        cfg, prompt = self.task_config, self.task.prompt
        if prompt is None:
            raise ValueError(f"{self.task.source}: a chat model's task needs a [prompt] table")
        template = (self.asset_dir / "chat_template.jinja").read_text(encoding="utf-8")
        specials = tuple(sorted(cfg.get("special_tokens", {}).items()))
        self.chat = ChatPrompt(template, prompt.instruction, prompt.system, specials)
        tokenizer = Tokenizer.from_file(str(self.asset_dir / "tokenizer.json"))
        overhead = len(tokenizer.encode(self.chat(""), add_special_tokens=False).ids)
        context, most_new = cfg["context"], self.task.option("max_new_tokens").high
        window = min(context - overhead - most_new, context // 2)
        if window < SMALLEST_WINDOW:
            raise ValueError(
                f"{self.task.source}: the prompt takes {overhead} tokens and MAX_NEW_TOKENS up to {most_new}, which "
                f"leaves {window} of the {context}-token context for the text; lower the max_new_tokens range"
            )
        return BatchTokenizer(tokenizer, window + 1)  # a piece's window is max_tokens - 1 (its eos, elsewhere)

    def job_sources(self, pieces: list[str]) -> list[list[int]]:
        """Each piece, cut to the window at a token end, as the chat prompt's token ids."""
        window = self.source.max_tokens - 1
        ends = self.source.token_ends(pieces)
        cut = [
            piece[: token_ends[window - 1]] if len(token_ends) > window else piece
            for piece, token_ends in zip(pieces, ends)
        ]
        try:
            prompts = [self.chat(piece) for piece in cut]
        except Exception as err:  # the checkpoint's template refused the message (its raise_exception)
            raise InputError(f"the chat template refused the text: {err}") from None
        encodings = self.source.tokenizer.encode_batch(prompts, add_special_tokens=False)
        sources = [list(encoding.ids) for encoding in encodings]
        self.metrics.encoded([len(ids) for ids in sources], [len(token_ends) > window for token_ends in ends])
        return sources


class ChatTranslate(ChatFront):
    Options: type = TranslateOptions


class ChatSummarize(ChatFront):
    Options: type = AbstractiveOptions
