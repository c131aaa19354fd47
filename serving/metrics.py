"""Read Triton's Prometheus endpoint: used by tests, benchmarks and load tests alike."""

from __future__ import annotations

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
