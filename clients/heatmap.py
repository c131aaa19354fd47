"""Attention heatmaps as PNG files, with token labels on both axes (the seed's `plt.matshow(attentions[0][0])`).

Chinese token labels need a font that has Chinese glyphs; matplotlib's own DejaVu Sans has none and would
draw empty boxes. The project's `explain` extra installs Noto Sans SC (the `pylopdf-fonts-zh-cn` wheel,
SIL OFL), found first; otherwise any installed font of a known CJK family is used. With none, rendering
stops with a message that says what to install, instead of writing a PNG of empty boxes.

Figures are drawn on a `matplotlib.figure.Figure` (no pyplot, no GUI backend, no global state), and the
pixel size depends only on the matrix shape (`figure_pixels`), so callers and tests know what they get.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

DPI = 100
CELL_IN = 0.42  # inches per matrix cell
MARGIN_IN = (2.4, 1.9)  # room for labels and the colour bar: width, height
MIN_CELLS = 4  # a 1×1 matrix still gets a readable figure
CJK_FAMILIES = (
    "Noto Sans SC",
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Source Han Sans SC",
    "WenQuanYi Micro Hei",
    "WenQuanYi Zen Hei",
    "SimHei",
    "Microsoft YaHei",
    "PingFang SC",
    "AR PL UMing CN",
)
PROBE = "爱"  # a simplified-only character: Japanese-only fonts lack it


class HeatmapUnavailable(RuntimeError):
    """matplotlib is missing, or no installed font can draw Chinese characters."""


def _has_glyph(path: str, char: str = PROBE) -> bool:
    from matplotlib.ft2font import FT2Font

    try:
        return FT2Font(path).get_char_index(ord(char)) != 0
    except (OSError, RuntimeError):
        return False


def find_cjk_font() -> Path:
    """Path of a font file that draws Chinese; raises `HeatmapUnavailable` naming what to install."""
    try:
        import pylopdf_fonts_zh_cn

        bundled = Path(pylopdf_fonts_zh_cn.sans_path())
        if bundled.is_file() and _has_glyph(str(bundled)):
            return bundled
    except ImportError:
        pass
    try:
        from matplotlib import font_manager
    except ImportError:
        raise HeatmapUnavailable("--png needs matplotlib: pip install -e '.[explain]'") from None
    for family in CJK_FAMILIES:
        for entry in font_manager.fontManager.ttflist:
            if entry.name == family and _has_glyph(entry.fname):
                return Path(entry.fname)
    raise HeatmapUnavailable(
        "no font with Chinese characters found for the heatmap labels: install the project's 'explain' extra "
        "(pip install -e '.[explain]', it brings Noto Sans SC) or a system CJK font (apt-get install fonts-noto-cjk)"
    )


def figure_pixels(rows: int, cols: int) -> tuple[int, int]:
    """(width, height) in pixels of the PNG for a rows × cols matrix."""
    width = MARGIN_IN[0] + CELL_IN * max(cols, MIN_CELLS)
    height = MARGIN_IN[1] + CELL_IN * max(rows, MIN_CELLS)
    return round(width * DPI), round(height * DPI)


def render_heatmap(
    matrix: NDArray[Any],
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    path: str | Path,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
) -> Path:
    """Write `matrix` [rows, cols] as a PNG heatmap: row labels on the left, column labels on top."""
    from matplotlib.figure import Figure
    from matplotlib.font_manager import FontProperties

    matrix = np.asarray(matrix, dtype=np.float32)
    if matrix.ndim != 2 or matrix.shape != (len(row_labels), len(col_labels)):
        raise ValueError(f"matrix of shape {matrix.shape} does not fit {len(row_labels)} × {len(col_labels)} labels")
    font = FontProperties(fname=str(find_cjk_font()))
    width, height = figure_pixels(*matrix.shape)
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    axes = figure.subplots()
    image = axes.matshow(matrix, cmap="viridis", vmin=0.0)
    axes.set_xticks(range(len(col_labels)), list(col_labels), fontproperties=font)
    for label in axes.get_xticklabels():  # one or two Chinese characters read best upright
        label.set_rotation(90 if len(label.get_text()) > 2 else 0)
    axes.set_yticks(range(len(row_labels)), list(row_labels), fontproperties=font)
    axes.set_xlabel(xlabel, fontproperties=font)
    axes.set_ylabel(ylabel, fontproperties=font)
    axes.xaxis.set_label_position("top")
    if title:
        axes.set_title(title, fontproperties=font, fontsize=10)
    figure.colorbar(image, ax=axes, shrink=0.8, label="attention")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI, format="png")
    return path
