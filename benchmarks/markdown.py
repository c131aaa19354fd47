"""Markdown pieces every report section uses: a figure with its spread, a table, and a generated block of a
committed document (between two marker comments) kept equal to what a command writes."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cell(summary: dict[str, Any], digits: int = 0) -> str:
    """median [min–max]: the spread of the repetitions stays visible next to the figure."""
    fmt = f"{{:.{digits}f}}"
    if summary["n"] == 1:
        return fmt.format(summary["median"])
    return f"{fmt.format(summary['median'])} [{fmt.format(summary['min'])}–{fmt.format(summary['max'])}]"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def between_markers(text: str, begin: str, end: str, body: str) -> str:
    """``text`` with what stands between the marker lines ``begin`` and ``end`` replaced by ``body``."""
    if begin not in text or end not in text:
        raise ValueError(f"no {begin!r} … {end!r} markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def write_or_check(document: Path, wanted: str, check: bool, command: str) -> int:
    """Write ``wanted`` to ``document``; with ``check``, only compare: 1 when they differ, naming ``command``."""
    if not check:
        document.write_text(wanted, encoding="utf-8")
        print(f"wrote {document.name}", file=sys.stderr)
        return 0
    if document.read_text(encoding="utf-8") != wanted:
        print(f"{document.name} is out of date: run `{command}`", file=sys.stderr)
        return 1
    return 0


def committed_result_table(
    argv: list[str] | None,
    *,
    module: str,
    result: Path,
    document: Path,
    markers: tuple[str, str],
    table_of: Callable[[dict[str, Any]], list[str]],
    description: str,
) -> int:
    """The command behind a docs table written from a committed result file (`python -m <module>`): ``--result
    FILE`` commits a fresh run first, ``--check`` only compares. ``table_of`` refuses an incomplete result."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("--result", type=Path, help=f"a fresh result to commit as {result.name} first")
    parser.add_argument("--check", action="store_true", help=f"exit 1 when {document.name}'s table is out of date")
    args = parser.parse_args(argv)
    if args.result:
        table_of(json.loads(args.result.read_text(encoding="utf-8")))  # refuse an incomplete run before copying it
        shutil.copyfile(args.result, result)
    lines = table_of(json.loads(result.read_text(encoding="utf-8")))
    wanted = between_markers(document.read_text(encoding="utf-8"), *markers, "\n".join(lines))
    return write_or_check(document, wanted, args.check, f"python -m {module}")
