"""Read Triton's Prometheus endpoint: used by tests, benchmarks and load tests alike."""

from __future__ import annotations

import time
import urllib.request


def scrape(metrics_url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
        return response.read().decode()


def metric_values(text: str, name: str, **labels: str) -> list[float]:
    """Values of one metric in Prometheus exposition text whose labels include `labels`."""
    values = []
    for line in text.splitlines():
        if not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            values.append(float(value))
    return values


def metric_sum(metrics_url: str, name: str, **labels: str) -> float:
    return sum(metric_values(scrape(metrics_url), name, **labels))


def settled_sums(
    metrics_url: str, names: list[str], at_least: float = 0.0, settle_s: float = 0.3, timeout_s: float = 10.0, **labels
) -> tuple[float, ...]:
    """metric_sum of each of `names`, read once the values stop changing (and the first is ≥ `at_least`).

    Triton counts a model's inferences when its execute() returns, which can be a moment after the
    client already has its answer: a scrape right after the last response may miss the last batch.
    """
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        text = scrape(metrics_url)
        now = tuple(sum(metric_values(text, name, **labels)) for name in names)
        if (now == last and now[0] >= at_least) or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(settle_s)
