"""Temporary model repositories for the serving variants (dynamic batching on/off, instance count).

The committed configs under model_repository/ are never edited: each variant gets a folder whose config files
are rewritten copies and whose model files are symlinks to the built ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from benchmarks.profiles import REPOSITORY
from serving.ort_backend.session_config import available_cpus

SENTIMENT_MODELS = ("sentiment", "sentiment_encoder")
THROUGHPUT_QUEUE_SIZE = 4096  # a committed queue limit would reject requests at concurrency 32: raise it


@dataclass(frozen=True)
class ServingVariant:
    """Dynamic batching on/off and the instance count of both sentiment models; ``None`` keeps the committed
    setting, so ``ServingVariant()`` is the endpoint as shipped (only its queue limit raised)."""

    batching: bool | None = None
    instances: int | None = None
    queue_policy: bool = True  # False: drop the committed default_queue_policy (queue limit and timeout)

    @property
    def name(self) -> str:
        if self.batching is None and self.instances is None:
            return "served" if self.queue_policy else "served_without_queue_policy"
        batching = {None: "", True: "batching_", False: "no_batching_"}[self.batching]
        return batching + (f"{self.instances}inst" if self.instances else "as_committed")


def _block_span(text: str, keyword: str) -> tuple[int, int] | None:
    """Start and end of ``keyword { ... }`` (nested braces included), or None."""
    match = re.search(rf"^\s*{keyword}\s*{{", text, flags=re.MULTILINE)
    if match is None:
        return None
    depth, pos = 0, match.end() - 1
    for pos in range(match.end() - 1, len(text)):
        depth += {"{": 1, "}": -1}.get(text[pos], 0)
        if depth == 0:
            return match.start(), pos + 1
    raise ValueError(f"unbalanced braces after '{keyword}'")


def rewrite_config(text: str, variant: ServingVariant) -> str:
    """A config.pbtxt with the variant's batching, instance count and threads per instance, and a queue limit
    high enough for throughput runs."""
    span = _block_span(text, "dynamic_batching")
    if variant.batching is False and span is not None:
        text = text[: span[0]] + "\n" + text[span[1] :]
    policy = _block_span(text, "default_queue_policy")
    if not variant.queue_policy and policy is not None:
        text = text[: policy[0]] + "\n" + text[policy[1] :]
    text = re.sub(r"max_queue_size\s*:\s*\d+", f"max_queue_size: {THROUGHPUT_QUEUE_SIZE}", text)
    if variant.instances is None:
        return text
    # Same thread budget for every instance count: n instances × (cores / n) intra-op threads each.
    threads = max(1, available_cpus() // variant.instances)
    text = re.sub(
        r'(key:\s*"intra_op_thread_count"\s*,\s*value:\s*{\s*string_value:\s*)"\d+"', rf'\g<1>"{threads}"', text
    )
    group = f"instance_group [ {{ count: {variant.instances}, kind: KIND_CPU }} ]"
    text, replaced = re.subn(r"instance_group\s*\[[^\]]*\]", group, text)
    return text if replaced else text + "\n" + group + "\n"


def build(root: Path, variant: ServingVariant, models: tuple[str, ...] = SENTIMENT_MODELS) -> Path:
    """Write the variant's repository under ``root / variant.name`` and return it."""
    repo = Path(root) / variant.name
    for model in models:
        for source in (REPOSITORY / model).rglob("*"):
            if "__pycache__" in source.parts or source.is_dir():
                continue
            target = repo / model / source.relative_to(REPOSITORY / model)
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.suffix == ".pbtxt":
                target.write_text(rewrite_config(source.read_text(encoding="utf-8"), variant), encoding="utf-8")
            else:
                target.symlink_to(source.resolve())
    return repo
