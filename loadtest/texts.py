"""Request texts for the load test: the real test sets when a data directory is given, else a small built-in list.

Files read under ``--data-dir`` (the layout of the project's data directory, see docs/models.md):
``sentiment/waimai_10k/waimai_10k.csv`` (``label,review``), ``translation/tatoeba_test_zh_en.tsv``
(``zh<TAB>en`` with a header) and ``summarization/clge_lcsts_csl/lcsts_val.tsv`` (``summary<TAB>text``).
"""

from __future__ import annotations

import csv
from pathlib import Path

ENDPOINTS = ("sentiment", "translate", "summarize")

FALLBACK: dict[str, list[str]] = {
    "sentiment": [
        "这部电影不差",
        "服务一点也不好",
        "很快，好吃，味道足，量大",
        "送餐太慢了，等了一个多小时，饭都凉了",
        "味道还可以，就是有点贵",
        "包装很用心，下次还会再点",
    ],
    "translate": ["我爱你。", "他休息两天。", "我只有几支笔。", "今天天气很好。", "你叫什么名字？", "我们明天去北京。"],
    "summarize": [
        "面对撤资中国内地及香港的传言，李嘉诚希望用数字说话：长和系去年毛收入约4300亿港元，本年度投资海外两基建"
        "项目仅动用80亿，占比不足2%；而在香港货柜码头项目的投资已有40亿港元。",
        "国家统计局今天发布数据，上半年国内生产总值同比增长百分之七，增速与一季度持平，消费对经济增长的贡献率继续提高。",
        "记者从教育部获悉，今年全国高考报名人数达到九百多万，各地将采取多项措施保障考试安全，严厉打击考试作弊行为。",
    ],
}

FILES = {
    "sentiment": Path("sentiment/waimai_10k/waimai_10k.csv"),
    "translate": Path("translation/tatoeba_test_zh_en.tsv"),
    "summarize": Path("summarization/clge_lcsts_csl/lcsts_val.tsv"),
}


def _read(endpoint: str, path: Path) -> list[str]:
    with open(path, encoding="utf-8", newline="") as f:
        if endpoint == "sentiment":
            return [row["review"].strip() for row in csv.DictReader(f)]
        rows = [line.rstrip("\n").split("\t") for line in f]
    if endpoint == "translate":  # zh<TAB>en, header first
        return [cols[0].strip() for cols in rows[1:] if cols]
    return [cols[1].strip() for cols in rows if len(cols) >= 2]  # summary<TAB>text


def load_texts(data_dir: Path | str | None, limit: int = 2000) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(texts per endpoint, where each list came from). Missing files fall back to the built-in list."""
    texts: dict[str, list[str]] = {}
    sources: dict[str, str] = {}
    for endpoint in ENDPOINTS:
        path = Path(data_dir) / FILES[endpoint] if data_dir else None
        found = [t for t in _read(endpoint, path) if t][:limit] if path is not None and path.is_file() else []
        texts[endpoint] = found or list(FALLBACK[endpoint])
        sources[endpoint] = str(path) if found else "built-in list"
    return texts, sources


def parse_mix(mix: str) -> dict[str, float]:
    """``"sentiment:6,translate:3,summarize:1"`` → weights; endpoints left out get weight 0."""
    weights = dict.fromkeys(ENDPOINTS, 0.0)
    for part in filter(None, (p.strip() for p in mix.split(","))):
        name, _, weight = part.partition(":")
        if name not in weights:
            raise ValueError(f"unknown endpoint {name!r} in mix {mix!r}; choose from {', '.join(ENDPOINTS)}")
        try:
            weights[name] = float(weight or 1)
        except ValueError:
            raise ValueError(f"weight of {name} in mix {mix!r} must be a number") from None
        if weights[name] < 0:
            raise ValueError(f"weight of {name} in mix {mix!r} must be >= 0")
    if not any(weights.values()):
        raise ValueError(f"mix {mix!r} gives every endpoint weight 0")
    return weights
