"""`python -m clients explain {translate,sentiment} TEXT... [--png FILE] [--layer N]`.

Prints one line per text like the other commands, with what the model attended to appended:
translate shows, per target token, the source token it attended to most (`love←爱`); sentiment shows the
attention rollout over the input tokens (`不差:0.41`). `--json` prints the tokens and full matrices.
`--png` draws one layer as a heatmap with token labels on both axes (see clients/heatmap.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .explain import DECODERS, SentimentAttention, TranslationAlignment

EXAMPLE = 'python -m clients explain translate "我爱你。" --png alignment.png'
SENTIMENT_EXAMPLE = "python -m clients explain sentiment 这部电影不差 --png attention.png --layer 0"


def add_explain_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The `explain` sub-command (the caller adds the shared generation and connection flags)."""
    summary = "show what a model attended to: tokens and attention matrices, optionally as a PNG heatmap"
    parser = commands.add_parser(
        "explain",
        help=summary,
        description=f"{summary[0].upper()}{summary[1:]}.\n\n{__doc__.split(chr(10) + chr(10))[1]}",
        epilog=f"examples:\n  {EXAMPLE}\n  {SENTIMENT_EXAMPLE}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("task", choices=sorted(DECODERS), help="the endpoint to explain")
    parser.add_argument("texts", nargs="+", metavar="TEXT", help='Chinese text; "-" reads lines from stdin')
    parser.add_argument(
        "--png",
        type=Path,
        metavar="FILE",
        help="write a heatmap (one text: FILE; several: FILE-1.png, FILE-2.png, ...)",
    )
    parser.add_argument(
        "--layer",
        type=int,
        default=-1,
        metavar="N",
        help="layer to show in the text line and the heatmap, 0-based; -1 = the last (default)",
    )
    return parser


def png_paths(path: Path, count: int) -> list[Path]:
    if count == 1:
        return [path]
    return [path.with_name(f"{path.stem}-{i}{path.suffix or '.png'}") for i in range(1, count + 1)]


def pick_layer(attention: Any, layer: int) -> int:
    """`layer` as a non-negative index into attention [layers, ...]; ValueError names the valid range."""
    layers = int(attention.shape[0])
    if not -layers <= layer < layers:
        raise ValueError(f"--layer {layer}: the model has {layers} layers (0..{layers - 1}, or -1 for the last)")
    return layer % layers


def format_explained(text: str, result: Any, layer: int, as_json: bool) -> str:
    """One output line for one explained text."""
    if as_json:
        fields = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in vars(result).items()}
        return json.dumps({"text": text, **fields}, ensure_ascii=False)
    line = " ".join(text.splitlines())
    if isinstance(result, TranslationAlignment):
        pairs = " ".join(f"{t}←{s}" for t, s in result.strongest_sources(pick_layer(result.attention, layer)))
        return f"{result.translation}\t{pairs}"
    shares = " ".join(f"{t}:{r:.2f}" for t, r in zip(result.tokens, result.rollout))
    return f"{result.label}\t{result.score:.4f}\t{line}\t{shares}"


def render(result: Any, layer: int, path: Path) -> Path:
    """One layer of `result` as a heatmap PNG: target × source tokens, or query × key tokens."""
    from .heatmap import render_heatmap

    index = pick_layer(result.attention, layer)
    where = f"layer {index} (of 0–{result.attention.shape[0] - 1}), head average"
    if isinstance(result, TranslationAlignment):
        axes = (result.target_tokens, result.source_tokens, "target", "source")
        title = f"{result.translation}\ncross-attention, {where}"
    else:
        assert isinstance(result, SentimentAttention)
        axes = (result.tokens, result.tokens, "query", "key")
        title = f"{result.label} {result.score:.2f}\nself-attention, {where}"
    rows, cols, ylabel, xlabel = axes
    return render_heatmap(result.attention[index], rows, cols, path, title=title, xlabel=xlabel, ylabel=ylabel)


def explain_lines(pairs: Iterable[tuple[str, Any]], args: argparse.Namespace, count: int) -> Iterator[str]:
    """Output lines for (text, result) pairs of `count` texts; writes the heatmaps on the way when --png is set.

    The font is looked up before the first result is pulled, so a missing font fails before any request.
    """
    paths: list[Path] = []
    if args.png is not None:
        from .heatmap import find_cjk_font

        find_cjk_font()
        paths = png_paths(args.png, count)
    for index, (text, result) in enumerate(pairs):
        line = format_explained(text, result, args.layer, args.json)
        if paths:
            print(f"wrote {render(result, args.layer, paths[index])}", file=sys.stderr)
        yield line
