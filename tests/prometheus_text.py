"""Read Triton's Prometheus endpoint in the tests: scrape, pick samples by name and labels, let counts settle."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import TypeVar

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

T = TypeVar("T")


def scrape(metrics_url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
        return response.read().decode()


def metric_values(text: str, name: str, **labels: str) -> list[float]:
    """Values of the samples called `name` (e.g. ``nv_inference_count``, ``ropeserve_texts_total``) in Prometheus
    exposition text whose labels include `labels`."""
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if name in _names(family, sample) and all(sample.labels.get(k) == v for k, v in labels.items())
    ]


def _names(family: Metric, sample: Sample) -> set[str]:
    """The names a sample answers to. prometheus_client's parser appends ``_total`` to every counter sample, also to
    Triton's, which its exposition (and Prometheus) names without it: ``nv_inference_count``."""
    if family.type == "counter" and sample.name == family.name + "_total":
        return {family.name, sample.name}
    return {sample.name}


def metric_sum(metrics_url: str, name: str, **labels: str) -> float:
    return sum(metric_values(scrape(metrics_url), name, **labels))


def settled(read: Callable[[], T], ready: Callable[[T], bool], settle_s: float = 0.3, timeout_s: float = 10.0) -> T:
    """``read()`` once two reads ``settle_s`` apart agree and ``ready`` holds for them (the last read at the
    timeout). Metrics lag the answers a client has: Triton counts a model's inferences when its execute()
    returns, and the front models send their own every FLUSH_PERIOD_S (serving/frontends/metrics.py)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        now = read()
        if (now == last and ready(now)) or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(settle_s)


def settled_sums(
    metrics_url: str, names: list[str], at_least: float = 0.0, settle_s: float = 0.3, timeout_s: float = 10.0, **labels
) -> tuple[float, ...]:
    """metric_sum of each of `names`, read once the values stop changing (and the first is ≥ `at_least`)."""

    def sums() -> tuple[float, ...]:
        text = scrape(metrics_url)
        return tuple(sum(metric_values(text, name, **labels)) for name in names)

    return settled(sums, lambda now: now[0] >= at_least, settle_s, timeout_s)
