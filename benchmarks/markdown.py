"""Markdown pieces every report section uses: a figure with its spread, and a table."""

from __future__ import annotations

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
