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

from typing import Any

from tokenizers import Tokenizer

from serving.engine.engine import Job
from serving.engine.sampling import Sampling
from serving.engine.search import Finish
from serving.frontends.base import BatchTokenizer, InputError, Overloaded, decode_texts
from serving.frontends.engine_front import QUEUE_FULL, EngineFront
from serving.frontends.options import AbstractiveOptions, NoOptions, TranslateOptions
from serving.text import chat_request
from serving.text.chat import ChatPrompt
from serving.text.chat_request import ChatRequest
from serving.text.tokenizer import detokenize, settled_prefix
from tasks.definition import TEXT_INPUT

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


FINISH_REASONS = {Finish.EOS: "stop", Finish.LENGTH: "length"}  # OpenAI's words; a stop string is "stop" too


class ChatCompletions(ChatFront):
    """`<task>_chat`: one chat request (serving/text/chat_request.py) per Triton request, its conversation
    rendered with the checkpoint's chat template (or its raw prompt tokenized as it is), one row of the engine,
    greedy or sampled; answered as a stream of TEXT pieces, the last with FINISH_REASON ("stop": the model ended
    or a stop string came; "length": max_tokens or the context ran out) and PROMPT_TOKENS / COMPLETION_TOKENS
    (the answer's tokens, its end token not counted). A request that leaves out max_tokens may fill the context."""

    Options: type = NoOptions

    def __init__(self, pb: Any, args: dict) -> None:
        super().__init__(pb, args)
        self.sampling_defaults = dict(self.task_config["generation"].get("sampling", {}))

    def read_request(self, request: Any) -> tuple[list[str], ChatRequest]:
        tensor = self.pb.get_input_tensor_by_name(request, TEXT_INPUT)
        if tensor is None:
            raise InputError(f"missing required input {TEXT_INPUT}", "missing_input")
        texts = decode_texts(tensor.as_numpy())
        if len(texts) != 1:
            raise InputError(f"a chat request is one {TEXT_INPUT} (shape [1, 1]), got {len(texts)}", "bad_shape")
        try:
            return texts, chat_request.parse(texts[0]).with_defaults(self.sampling_defaults)
        except chat_request.ChatRequestError as err:
            raise InputError(str(err), "invalid_input") from None

    def runs_as_group(self, options: Any) -> bool:
        return False

    def submit(self, request: Any, texts: list[str], options: Any) -> None:
        chat: ChatRequest = options
        ids = self.prompt_ids(chat)
        context = self.task_config["context"]
        room = context - len(ids)
        if room < 1 or (chat.max_tokens or 1) > room:
            asked = f" and max_tokens {chat.max_tokens}" if chat.max_tokens else ""
            raise InputError(
                f"the prompt is {len(ids):,} tokens{asked}; the model's context is {context:,} tokens "
                "(shorten the conversation, or ask for fewer tokens)",
                "context_length_exceeded",
            )
        if self.engine.queued_rows() + 1 > self.settings.max_queued_rows:
            raise Overloaded(QUEUE_FULL)
        reply = ChatReply(self, request.get_response_sender(), len(ids), chat.stop)
        job = Job(ids, chat.max_tokens or room, 1, reply.on_tokens, reply.fail, group=reply, sampling=sampling(chat))
        reply.jobs = [job]
        self.metrics.encoded([len(ids)], [False])
        with self._live_lock:
            self._live.add(reply)
        self.engine.submit(job)

    def prompt_ids(self, chat: ChatRequest) -> list[int]:
        if chat.messages is None:
            text = chat.prompt or ""
        else:
            try:
                text = self.chat.render(chat.conversation())
            except Exception as err:  # the checkpoint's template refused the conversation (its raise_exception)
                raise InputError(f"the chat template refused the messages: {err}") from None
        return list(self.source.tokenizer.encode(text, add_special_tokens=False).ids)


def sampling(chat: ChatRequest) -> Sampling | None:
    """How the request draws its tokens; None (greedy) at temperature 0."""
    temperature = 1.0 if chat.temperature is None else chat.temperature
    if temperature == 0:
        return None
    return Sampling(
        temperature=temperature,
        top_p=1.0 if chat.top_p is None else chat.top_p,
        top_k=chat.top_k or 0,
        repetition_penalty=1.0 if chat.repetition_penalty is None else chat.repetition_penalty,
        seed=None if chat.seed is None else chat.seed % (1 << 64),
    )


class ChatReply:
    """The answer to one chat request, streamed as its tokens come (on the front model's messenger thread, which
    alone changes it). Text that could be the start of a stop string is held back until it is known not to be;
    once a stop string shows, the answer ends before it and its row leaves the engine."""

    def __init__(self, front: ChatCompletions, sender: Any, prompt_tokens: int, stop: tuple[str, ...]) -> None:
        self.front = front
        self.sender = sender
        self.prompt_tokens = prompt_tokens
        self.stop = stop
        self.tokens: list[int] = []
        self.sent = ""
        self.jobs: list[Job] = []
        self.is_cancelled = False
        self.started = False
        self.failed = False
        self.done = False

    def poll(self) -> None:
        if not self.is_cancelled and self.sender.is_cancelled():
            self.is_cancelled = True
            self.front.engine.cancel(self.jobs)

    def fail(self, message: str) -> None:
        if self.failed or self.done:
            return
        self.failed = True
        self.front.engine.cancel(self.jobs)
        self.front.queue_response(self, [""], True, message)

    def on_tokens(self, tokens: list[int], finish: Finish | None) -> None:
        if self.failed or self.done:
            return
        self.tokens += tokens
        if self.is_cancelled:
            if finish is not None:
                self.done = True
                self.front.queue_response(self, [""], True, extra=self._status("cancelled"))
            return
        text = detokenize(self.front.target, self.tokens)
        reason = FINISH_REASONS.get(finish) if finish is not None else None
        stopped = min((at for at in (text.find(s) for s in self.stop) if at >= 0), default=-1)
        if stopped >= 0:
            text, reason = text[:stopped], "stop"
            if finish is None:
                self.front.engine.cancel(self.jobs)  # its later tokens are not wanted
        elif reason is None:
            text = self._held_back(settled_prefix(text))
        piece = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent += piece
        if reason is not None:
            self.done = True
            self.front.metrics.generated(len(self.tokens))
            self.front.queue_response(self, [piece], True, extra=self._status(reason))
        elif piece:
            self.front.queue_response(self, [piece], False, extra=self._status(""))

    def _held_back(self, text: str) -> str:
        """`text` without its longest ending that a stop string starts with."""
        for size in range(min(len(text), max(map(len, self.stop), default=1) - 1), 0, -1):
            if any(stop.startswith(text[-size:]) for stop in self.stop):
                return text[:-size]
        return text

    def _status(self, reason: str) -> dict[str, Any]:
        return {"FINISH_REASON": reason, "PROMPT_TOKENS": self.prompt_tokens, "COMPLETION_TOKENS": len(self.tokens)}
