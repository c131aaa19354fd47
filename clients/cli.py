"""Command line: `python -m clients` / `ropeserve`, one sub-command per task of ``tasks/*.toml``, plus explain.

Parsing, reading texts, calling and formatting are separate functions so tests can drive each one alone
(the formatter takes any object with the `Client` methods). Connection flags are accepted before or after the
sub-command, because people type both.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, is_dataclass
from typing import Any, TextIO

from .client import Client
from .endpoints import endpoint
from .errors import ClientError, ServerUnreachable
from .explain_cli import EXAMPLE as EXPLAIN_EXAMPLE
from .explain_cli import add_explain_parser, explain_lines
from .heatmap import HeatmapUnavailable
from .retry import RetryPolicy
from .task_definitions import Option, Task, registry
from .transport import DEFAULT_TIMEOUT_S, TRANSPORTS

EXIT_OK = 0
EXIT_REQUEST_FAILED = 1  # the server answered with an error, or did not answer in time
EXIT_USAGE = 2  # argparse's own code for bad command lines
EXIT_UNREACHABLE = 3
DEFAULT_BATCH_SIZE = 8  # a safe batch for every model (the explain models take 8); the endpoints take 64

EPILOG = """\
texts: give them as arguments; "-" reads one text per non-empty line from stdin; --file reads a whole document.
output: one line per text in input order; --json prints one JSON object per line instead.
exit codes: 0 ok, 1 the server rejected a request or timed out, 2 bad command line, 3 server unreachable.

examples:
"""


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return number


def positive_float(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def add_common_flags(parser: argparse.ArgumentParser, with_defaults: bool) -> None:
    """Connection and output flags; a sub-command's copy has no defaults: it overrides only what was typed."""

    def default(value: Any) -> Any:
        return value if with_defaults else argparse.SUPPRESS

    parser.add_argument(
        "--url",
        default=default(None),
        help="Triton address host:port (default: 127.0.0.1:8001 for grpc, 127.0.0.1:8000 for http)",
    )
    parser.add_argument("--protocol", choices=sorted(TRANSPORTS), default=default("grpc"), help="default: grpc")
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=default(DEFAULT_TIMEOUT_S),
        metavar="SECONDS",
        help=f"per-request timeout (default: {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--attempts",
        type=positive_int,
        default=default(RetryPolicy().max_attempts),
        help="tries per request while the server is overloaded or unreachable; 1 = no retries (default: 3)",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=default(DEFAULT_BATCH_SIZE),
        help=f"texts per request (default: {DEFAULT_BATCH_SIZE})",
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="print one JSON object per text")


def add_option_flags(parser: argparse.ArgumentParser, options: Iterable[Option]) -> None:
    """One flag per task option, named and bounded by the task definition; unset flags are not sent.

    A string option's flag takes only its choices (argparse refuses others before anything is sent); an int
    option's range is the server's to check, as it is for the SDK."""
    for option in options:
        typed: dict[str, Any] = (
            {"type": str, "choices": option.choices} if option.choices else {"type": int, "metavar": "N"}
        )
        parser.add_argument(
            *option.flags,
            dest=option.keyword,
            help=f"{option.help}, {option.allowed} (server default: {option.default})",
            **typed,
        )


def explained_options(tasks: dict[str, Task]) -> list[Option]:
    """The options of the explainable tasks, each keyword once (the explain command takes any of them)."""
    found: dict[str, Option] = {}
    for task in tasks.values():
        if task.explain is not None:
            for option in task.options:
                found.setdefault(option.keyword, option)
    return list(found.values())


def build_parser() -> argparse.ArgumentParser:
    tasks = registry()
    parser = argparse.ArgumentParser(
        prog="python -m clients",
        description=f"Call the ropeserve Triton endpoints: {', '.join(tasks)}, and explain their attention.",
        epilog=EPILOG + "\n".join(f"  {e}" for e in [*(t.example for t in tasks.values()), EXPLAIN_EXAMPLE]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_flags(parser, with_defaults=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, task in tasks.items():
        command = commands.add_parser(
            name,
            help=task.summary,
            description=f"{task.summary[0].upper()}{task.summary[1:]}.",
            epilog=f"example:\n  {task.example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_argument("texts", nargs="*", metavar="TEXT", help='text; "-" reads lines from stdin')
        command.add_argument(
            "--file",
            metavar="PATH",
            help=(
                'a UTF-8 document ("-": stdin) answered as one text; '
                + (
                    "its paragraphs (blank-line separated) are sent as texts of their own and the translation "
                    "keeps its layout"
                    if "split_sentences" in (o.keyword for o in task.options)
                    else "printed as one line"
                )
            ),
        )
        add_option_flags(command, task.options)
        if task.stream is not None:
            command.add_argument(
                "--stream",
                action="store_true",
                help=f"print each answer as it is generated ({task.stream.name}; one text at a time)",
            )
        add_common_flags(command, with_defaults=False)
    explain = add_explain_parser(commands)
    add_option_flags(explain, explained_options(tasks))
    add_common_flags(explain, with_defaults=False)
    return parser


def read_texts(arguments: Sequence[str], stdin: TextIO) -> list[str]:
    """The texts to send: arguments as given, with "-" replaced by stdin's non-empty lines (read once)."""
    texts: list[str] = []
    for argument in arguments:
        if argument == "-":
            texts.extend(line.rstrip("\r\n") for line in stdin if line.strip())
        else:
            texts.append(argument)
    return texts


def paragraphs(document: str) -> tuple[list[str], list[str]]:
    """A document's paragraphs (runs of non-blank lines) and the layout around them: ``gaps[i]`` goes before
    paragraph i, ``gaps[-1]`` after the last (len(gaps) == len(paragraphs) + 1)."""
    parts = re.split(r"((?:[ \t]*\r?\n){2,}|^\s+|\s+$)", document)
    found: list[str] = []
    gaps = [""]
    for i, part in enumerate(parts):
        if i % 2 == 1 or not part.strip():
            gaps[-1] += part
        else:
            found.append(part)
            gaps.append("")
    return found, gaps


def layout(gap: str) -> str:
    """A gap between paragraphs as the answer writes it: its line breaks, nothing else."""
    return "\n" * gap.count("\n")


def document_lines(client: Any, args: argparse.Namespace, document: str) -> Iterator[str]:
    """--file: the document's answer. A task that splits sentences gets the paragraphs as texts (a request holds
    --batch-size of them, so an article of any length stays within the per-text limits) and the answer keeps the
    blank lines between them; with --stream each paragraph is printed as it arrives, in order."""
    options = task_options(args.command, args)
    if "split_sentences" not in options:
        pairs = run_task(client, args.command, [document], options, args.batch_size)
        yield from format_results(args.command, pairs, args.json)
        return
    found, gaps = paragraphs(document)
    if not found:
        raise ValueError("the document is empty")
    answers = []
    if getattr(args, "stream", False):
        for number, paragraph in enumerate(found):
            if number and not args.json:
                sys.stdout.write(layout(gaps[number]))
            pieces = []
            for piece in client.stream(args.command, paragraph, **options):
                pieces.append(piece)
                if not args.json:
                    sys.stdout.write(piece)
                    sys.stdout.flush()
            answers.append("".join(pieces))
    else:
        answers = [answer for _, answer in run_task(client, args.command, found, options, args.batch_size)]
    answer = "".join(layout(gap) + text for gap, text in zip(gaps, answers)).lstrip("\n")
    if args.json:
        yield json.dumps({"text": document, endpoint(args.command).outputs[0].lower(): answer}, ensure_ascii=False)
    elif getattr(args, "stream", False):
        yield ""
    else:
        yield answer


def read_document(path: str, stdin: TextIO) -> str:
    """--file's document: the file's text, or stdin's for "-"."""
    if path == "-":
        return stdin.read()
    with open(path, encoding="utf-8") as file:
        return file.read()


def task_options(task: str, args: argparse.Namespace) -> dict[str, int | str | None]:
    """The keyword arguments of `task`'s client method that the command line set (names match the SDK's)."""
    return {keyword: getattr(args, keyword, None) for keyword in endpoint(task).options}


def chunks(texts: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(texts), size):
        yield texts[start : start + size]


def run_task(
    client: Any, task: str, texts: Sequence[str], options: dict[str, int | str | None], batch_size: int
) -> Iterator[tuple[str, Any]]:
    """(text, result) pairs, one request per `batch_size` texts, yielded as each request completes."""
    return run_batches(getattr(client, task), texts, options, batch_size)


def run_batches(
    call: Callable[..., list[Any]], texts: Sequence[str], options: dict[str, int | str | None], batch_size: int
) -> Iterator[tuple[str, Any]]:
    """`run_task` for any client method that takes a batch of texts and keyword options."""
    for batch in chunks(texts, batch_size):
        yield from zip(batch, call(list(batch), **options), strict=True)


def one_line(text: str) -> str:
    """Keep the one-line-per-text promise even when a text or an answer contains line breaks."""
    return " ".join(text.splitlines())


def format_result(task: str, text: str, result: Any, as_json: bool) -> str:
    """One output line: tab-separated for people and `cut`, or (--json) a JSON object, UTF-8 unescaped.

    A task with several outputs prints them all, then the text; a task with one prints just its answer.
    """
    fields = (
        asdict(result)
        if is_dataclass(result) and not isinstance(result, type)
        else {endpoint(task).outputs[0].lower(): result}
    )
    if as_json:
        return json.dumps({"text": text, **fields}, ensure_ascii=False)
    if len(fields) == 1:
        return one_line(str(result))
    return "\t".join([*(format_value(value) for value in fields.values()), one_line(text)])


def format_value(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else one_line(str(value))


def format_results(task: str, pairs: Iterable[tuple[str, Any]], as_json: bool) -> Iterator[str]:
    for text, result in pairs:
        yield format_result(task, text, result, as_json)


def one_line_error(error: ClientError, task: str, url: str) -> tuple[str, int]:
    """The message and exit code for a failed call; server messages can span lines, ours never do."""
    if isinstance(error, ServerUnreachable):
        return f"error: cannot reach Triton at {url} — is `make serve` running?", EXIT_UNREACHABLE
    return f"error: {task} failed: {' '.join(str(error).split())}", EXIT_REQUEST_FAILED


def output_lines(client: Any, args: argparse.Namespace, texts: Sequence[str]) -> Iterator[str]:
    """The lines to print for a parsed command line, requests sent as the lines are consumed."""
    if args.command == "explain":
        options = {o.keyword: getattr(args, o.keyword) for o in explained_options(registry())}
        pairs = run_batches(functools.partial(client.explain, args.task), texts, options, args.batch_size)
        return explain_lines(pairs, args, len(texts))
    pairs = run_task(client, args.command, texts, task_options(args.command, args), args.batch_size)
    return format_results(args.command, pairs, args.json)


def stream_lines(client: Any, args: argparse.Namespace, texts: Sequence[str]) -> Iterator[str]:
    """--stream: each text's answer written piece by piece as it arrives, then its line ends."""
    for text in texts:
        pieces = []
        for piece in client.stream(args.command, text, **task_options(args.command, args)):
            pieces.append(piece)
            if not args.json:
                sys.stdout.write(one_line(piece))
                sys.stdout.flush()
        answer = "".join(pieces)
        if args.json:
            yield json.dumps({"text": text, endpoint(args.command).outputs[0].lower(): answer}, ensure_ascii=False)
        else:
            yield ""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `ropeserve` / `python -m clients`; returns the exit code (argparse exits itself)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    document = getattr(args, "file", None)
    if document is not None and args.texts:
        parser.error("give texts or --file, not both")
    try:
        texts = [read_document(document, sys.stdin)] if document is not None else read_texts(args.texts, sys.stdin)
    except OSError as error:
        parser.error(f"cannot read --file: {error}")
    if not texts:
        parser.error('no texts to send (give TEXT arguments, "-" for stdin, or --file)')
    retry = RetryPolicy(max_attempts=args.attempts)
    client = Client(args.url, args.protocol, args.timeout, retry)
    try:
        if document is not None:
            lines = document_lines(client, args, texts[0])
        elif getattr(args, "stream", False):
            lines = stream_lines(client, args, texts)
        else:
            lines = output_lines(client, args, texts)
        for line in lines:
            print(line, flush=True)
    except ClientError as error:
        message, code = one_line_error(error, args.command, client.url)
        print(message, file=sys.stderr)
        return code
    except (TypeError, ValueError, HeatmapUnavailable) as error:  # refused before sending, e.g. --beams 99999999999
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader (e.g. `| head`) left early; that is not our failure. Silence the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    finally:
        client.close()
    return EXIT_OK
