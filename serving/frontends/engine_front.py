"""`translate` / `summarize` on the continuous-batching engine, and their streaming twins.

The front model validates each request as every front model does, then hands its texts to the engine
(serving/engine/) running in this process and returns at once: Triton can pass the next requests while the first
ones decode, and they join the running batch at the next step. Answers go back through each request's response
sender from the front model's messenger thread: one response per request (the endpoint), or, for the decoupled twin
(`<task>_stream`), a response each time some text is certain, flagged final at the end. The pieces of a stream
concatenated equal the non-streaming answer.

A task with the option `split_sentences` (translate) reads a text as a document: its sentences
(serving/frontends/sentences.py) are rows of their own, and the answer joins theirs in the source's layout. A
stream sends a document in order: the sentence being decoded streams as it is generated once every sentence
before it is done.

The engine's step graphs (encoder.onnx, decoder.onnx) sit in the front model's version folder
(export/graphs/step_export.py writes them). With the Triton parameter `precision` = "int8" the front model runs their
int8 twins instead (encoder.int8.onnx, decoder.int8.onnx: quantize_step_graphs); default fp32. A request that
would push the engine's queue past its bound is refused at once with UNAVAILABLE, which the SDK retries.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from tokenizers import Tokenizer

from serving.engine.engine import Engine, Job, Output
from serving.engine.job import deliver_all
from serving.engine.search import Finish
from serving.frontends import sentences
from serving.frontends.base import BatchTokenizer, FrontModel, InputError, Overloaded, to_column
from serving.frontends.metrics import EngineLoad
from serving.frontends.options import EngineOptions, TranslateOptions
from serving.frontends.sentences import Document
from serving.text.tokenizer import EOS_ID, detokenize, settled_prefix

CANCEL_POLL_S = 0.1
QUEUE_FULL = "the generation queue is full; retry later"
METRICS_PERIOD_S = 0.5


class EngineFront(FrontModel):
    Options: type = TranslateOptions
    TARGET_TOKENIZER = "target_tokenizer.json"  # beside the source's tokenizer.json

    def source_tokenizer(self) -> BatchTokenizer:
        """What reads the texts: the window a piece must fit in, its tokens' ends (where a long one is cut)."""
        return BatchTokenizer.from_file(self.asset_dir / "tokenizer.json", self.task_config["max_tokens"])

    def job_sources(self, pieces: list[str]) -> list[list[int]]:
        """Each piece's token ids as the engine reads them: here the encoder's source, ending with eos."""
        batch = self.encode(self.source, pieces, suffix=[EOS_ID])
        return [batch.ids[row, : batch.lengths[row]].tolist() for row in range(len(pieces))]

    def __init__(self, pb: Any, args: dict) -> None:
        super().__init__(pb, args)
        self.source = self.source_tokenizer()
        self.target = Tokenizer.from_file(str(self.asset_dir / self.TARGET_TOKENIZER))
        precision = self.parameters.get("precision", "fp32")
        self.engine = Engine.load(self.asset_dir, precision, self.graph_threads(), self.task.engine)
        self.settings = self.task.engine
        self.streaming = self.endpoint.decoupled
        self.output = self.outputs[0]
        # The engine's thread only decodes. Its outputs come to a thread of their own (the messenger), which
        # delivers them to the requests' replies (detokenizing, assembling documents) and sends the responses
        # they make: sending and asking whether a request was cancelled are messages the caller waits for.
        self._outbox: queue.SimpleQueue[list[Output] | None] = queue.SimpleQueue()
        self._responses: list[Outgoing] = []  # made by the messenger's deliveries, sent at the end of its round
        self._live: set[Reply] = set()
        self._live_lock = threading.Lock()
        self._messenger = threading.Thread(target=self._send_and_poll, name="engine-responses", daemon=True)
        self._messenger.start()
        self.engine.start(deliver=self._outbox.put)
        self._reporting = threading.Event()
        threading.Thread(target=self._report_metrics, name="engine-metrics", daemon=True).start()

    def finalize(self) -> None:
        self._reporting.set()
        self.engine.stop()
        self._outbox.put(None)
        self._messenger.join()
        super().finalize()

    def _send_and_poll(self) -> None:
        """Deliver the engine's outputs and send the responses they make; every CANCEL_POLL_S ask for each live
        request whether its client cancelled or went away."""
        polled = time.monotonic()
        while True:
            try:
                steps = [self._outbox.get(timeout=CANCEL_POLL_S)]
            except queue.Empty:
                steps = []
            while True:  # and whatever else is queued by now
                try:
                    steps.append(self._outbox.get_nowait())
                except queue.Empty:
                    break
            for outputs in steps:
                if outputs is not None:
                    deliver_all(outputs)  # every job has on_error: a failing callback fails its request only
            responses, self._responses = self._responses, []
            for sender, pieces, final, error, extra in _coalesce(responses):
                try:
                    if error is None:
                        self.respond(sender, pieces, final, extra)
                    else:
                        sender.send(
                            self.internal_error_response(error), flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                        )
                except Exception as err:  # noqa: BLE001 - one failed message must not stop every later answer
                    print(
                        f"ropeserve: {self.metrics.instance}: sending a response failed: {err}",
                        file=sys.stderr,
                        flush=True,
                    )
            if None in steps:
                return
            if time.monotonic() - polled >= CANCEL_POLL_S:
                polled = time.monotonic()
                with self._live_lock:
                    live = list(self._live)
                for reply in live:
                    reply.poll()

    def queue_response(
        self,
        reply: Any,
        pieces: Sequence[str],
        final: bool,
        error: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """A response a delivery made (on the messenger thread), sent at the end of the round; a final one (an
        error is final) ends the reply's polling. `extra`: the endpoint's other outputs, one value each (a chat
        twin's finish reason and token counts)."""
        if final or error is not None:
            with self._live_lock:
                self._live.discard(reply)
        first, reply.started = not reply.started, True
        self._responses.append(Outgoing(reply.sender, pieces, final, first, error, dict(extra or {})))

    def _report_metrics(self) -> None:
        """The engine's gauges and counters, twice a second (what a step counts is summed here, not per step)."""
        steps = queried = hits = 0
        while not self._reporting.wait(METRICS_PERIOD_S):
            stats = self.engine.stats
            waits, firsts = stats.drain()
            texts, rows = self.engine.scheduler.waiting()
            load = EngineLoad(stats.running_rows, self.engine.max_rows, texts, rows)
            prompts = (stats.prompt_tokens - queried, stats.cached_prompt_tokens - hits)
            self.metrics.engine(load, stats.steps - steps, waits, firsts, prompts)
            steps, queried, hits = stats.steps, stats.prompt_tokens, stats.cached_prompt_tokens

    def execute(self, requests: list[Any]) -> None:
        """Every answer goes through its request's response sender: now for the refused ones and those answered as
        a group, from the engine later for those taken on."""
        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request, response in zip(requests, self.answer(requests)):
            if response is not None:
                request.get_response_sender().send(response, flags=final)

    def runs_as_group(self, options: EngineOptions) -> bool:
        return False  # every text goes to the engine, unless a subclass answers some options whole

    def submit(self, request: Any, texts: list[str], options: EngineOptions) -> None:
        """The request's texts as documents whose pieces (sentences) are engine jobs, refused instead when they are
        too many for any queue (INVALID_ARGUMENT) or for the engine's queue now (UNAVAILABLE)."""
        documents = self.documents(texts, options.split_sentences)
        pieces = [piece for document in documents for piece in document.pieces]
        rows = len(pieces) * options.num_beams
        most = self.settings.max_queued_rows
        if rows > most:
            raise InputError(
                f"the request's texts are {len(pieces):,} sentences x {options.num_beams} beams = {rows:,} rows; "
                f"the limit is {most:,} rows per request (send fewer texts per request, or fewer beams)",
                "document_too_long",
            )
        if self.engine.queued_rows() + rows > most:
            raise Overloaded(QUEUE_FULL)
        sources = self.job_sources(pieces)
        self.metrics.sentences([len(document.pieces) for document in documents])
        reply = Reply(self, request.get_response_sender(), documents)
        bulk = len(pieces) > self.settings.interactive_sentences
        reply.jobs = [
            Job(
                source,
                options.max_new_tokens,
                options.num_beams,
                reply.callback(row),
                reply.fail,
                group=reply,
                bulk=bulk,
            )
            for row, source in enumerate(sources)
        ]
        # Polled for cancellation from here until its final response is queued: with every job known, so that a
        # cancellation reaches them all (one before its job is submitted refuses it at admission).
        with self._live_lock:
            self._live.add(reply)
        for job in reply.jobs:
            self.engine.submit(job)

    def documents(self, texts: list[str], mode: str) -> list[Document]:
        """Each text as the pieces the model translates: its sentences, cut further where one is longer than the
        model's window (mode "0": the text itself, truncated at the window, without the document limits)."""
        window = self.source.max_tokens - 1  # the end-of-sequence token takes one place
        most_chars, most_sentences = self.settings.max_document_chars, self.settings.max_document_sentences
        for i, text in enumerate(texts):
            if mode != "0" and len(text) > most_chars:
                raise InputError(
                    f"TEXT[{i}] has {len(text):,} characters; the limit is {most_chars:,} characters per text "
                    "(split the document into several texts)",
                    "document_too_long",
                )
        documents = [sentences.read(text, mode, window, self.source.token_ends) for text in texts]
        for i, document in enumerate(documents):
            if len(document.pieces) > most_sentences:
                raise InputError(
                    f"TEXT[{i}] has {len(document.pieces):,} sentences; the limit is {most_sentences} sentences per "
                    "text (split the document into several texts)",
                    "document_too_long",
                )
        return documents

    def respond(self, sender: Any, pieces: Sequence[str], final: bool, extra: Mapping[str, Any]) -> None:
        tensors = [self.pb.Tensor(self.output, np.array([[p.encode("utf-8")] for p in pieces], dtype=np.object_))]
        for name, value in extra.items():
            tensors.append(self.pb.Tensor(name, to_column([value] * len(pieces), self.output_dtype(name))))
        flags = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        sender.send(self.pb.InferenceResponse(output_tensors=tensors), flags=flags)


class Outgoing(NamedTuple):
    """A response a delivery made, waiting for the end of the messenger's round."""

    sender: Any
    pieces: Sequence[str]  # one per text of the request
    final: bool
    first: bool  # the request's first response
    error: str | None  # instead of the pieces: the request failed
    extra: dict[str, Any]  # the endpoint's other outputs, one value each


Coalesced = tuple[Any, list[str], bool, "str | None", dict[str, Any]]  # sender, pieces, final, error, extra


def _coalesce(items: list[Outgoing]) -> list[Coalesced]:
    """One response per request from the queued (sender, pieces, final, first, error, extra) items: a request's
    pieces that queued up while the messenger was busy go out as one, in order, with the latest other outputs,
    and an error replaces them; a request's first response goes before the others (the time to the first piece
    is what a streaming client waits for)."""
    merged: dict[int, tuple[Any, list[str], bool, bool, str | None, dict[str, Any]]] = {}
    for sender, pieces, final, first, error, extra in items:
        if id(sender) in merged:
            _, sent, _, was_first, _, _ = merged[id(sender)]
            joined = [a + b for a, b in zip(sent, pieces, strict=True)]
            merged[id(sender)] = (sender, joined, final, was_first, error, extra)
        else:
            merged[id(sender)] = (sender, list(pieces), final, first, error, extra)
    ordered = sorted(merged.values(), key=lambda item: not item[3])  # stable: otherwise in queued order
    return [(sender, pieces, final, error, extra) for sender, pieces, final, _, error, extra in ordered]


class Reply:
    """The answer to one request, filled row by row as the engine's outputs are delivered (on the front model's
    messenger thread, which alone changes it). Each text is a document whose pieces (sentences) are rows; a text's
    answer is its pieces' answers joined in the source's layout."""

    def __init__(self, front: EngineFront, sender: Any, documents: Sequence[Document]) -> None:
        self.front = front
        self.sender = sender
        self.documents = list(documents)
        self.text_of: list[int] = []  # per row, the text it belongs to
        self.first_row: list[int] = []  # per text, its first row
        for text, document in enumerate(self.documents):
            self.first_row.append(len(self.text_of))
            self.text_of += [text] * len(document.pieces)
        rows = len(self.text_of)
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.answers: list[str | None] = [None] * rows  # per row, its text once it is done
        self.frontier = list(self.first_row)  # per text, its first row not done: the only one a stream shows
        self.sent = [""] * len(self.documents)  # text already streamed, per text
        self.jobs: list[Job] = []  # per row, set before the reply is polled
        self.is_cancelled = False
        self.started = False  # a response was queued
        self.failed = False  # a row failed; the error response is queued

    def poll(self) -> None:
        """Ask the server whether the client cancelled or went away (the messenger thread, every CANCEL_POLL_S)."""
        if not self.is_cancelled and self.sender.is_cancelled():
            self.is_cancelled = True
            self.front.engine.cancel(self.jobs)

    def fail(self, message: str) -> None:
        """A row's generation failed: the request ends with the error (once), unless it was answered already."""
        if self.failed or self.finished():
            return
        self.failed = True
        self.front.engine.cancel(self.jobs)  # its other rows leave too
        self.front.queue_response(self, [""] * len(self.sent), True, message)

    def finished(self) -> bool:
        return all(answer is not None for answer in self.answers)

    def callback(self, row: int):
        def on_tokens(tokens: list[int], finish: Finish | None) -> None:
            if self.failed:  # answered with the error already
                return
            final = finish is not None
            self.tokens[row] += tokens
            if final and self.answers[row] is None:
                self.answers[row] = detokenize(self.front.target, self.tokens[row])
            finished = self.finished()
            if self.is_cancelled:
                if finished:
                    self.front.queue_response(self, [""] * len(self.sent), True)
                return
            if self.front.streaming:
                text = self.text_of[row]
                if row == self.frontier[text] or finished:  # a later sentence's tokens show only once it is next
                    self._stream(text, finished)
            elif finished:
                texts = [self._certain(text) for text in range(len(self.documents))]
                self.front.metrics.generated(sum(len(t) for t in self.tokens))
                self.front.queue_response(self, texts, True)

        return on_tokens

    def _certain(self, text: int) -> str:
        """What the text's answer is known to start with: the answers of its leading finished pieces in the
        source's layout, then the settled part of the next piece's (the whole answer once every piece is done)."""
        document = self.documents[text]
        first, end = self.first_row[text], self.first_row[text] + len(document.pieces)
        while self.frontier[text] < end and self.answers[self.frontier[text]] is not None:
            self.frontier[text] += 1
        done = [answer for answer in self.answers[first : self.frontier[text]] if answer is not None]
        if self.frontier[text] == end:
            return document.join(done)
        partial = detokenize(self.front.target, self.tokens[self.frontier[text]])
        return document.prefix(done, settled_prefix(partial))

    def _stream(self, changed: int, finished: bool) -> None:
        pieces = [""] * len(self.sent)
        for text in range(len(self.sent)) if finished else [changed]:
            certain = self._certain(text)
            if certain.startswith(self.sent[text]) and len(certain) > len(self.sent[text]):
                pieces[text] = certain[len(self.sent[text]) :]
                self.sent[text] = certain
        if finished:
            self.front.metrics.generated(sum(len(t) for t in self.tokens))
            self.front.queue_response(self, pieces, True)
        elif any(pieces):
            self.front.queue_response(self, pieces, False)
