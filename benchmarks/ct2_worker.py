"""CTranslate2 timed in a process of its own (benchmarks/imported.py spawns it): this module imports nothing but
ctranslate2 and psutil, so the process's resident memory is CTranslate2's."""

from __future__ import annotations

import statistics
import time
from typing import Any


def rows(
    model: str,
    precision: str,
    tokens: list[list[str]],
    beams: tuple[int, ...],
    threads: tuple[int, ...],
    new_tokens: int,
    batch: int,
    repetitions: int,
) -> list[dict[str, Any]]:
    """Sentences/s of `translate_batch` over `tokens` for each thread count and beam width (median of the
    repetitions after a warm-up pass), and the process's resident memory at the end."""
    import ctranslate2
    import psutil

    out = []
    for count in threads:
        translator = ctranslate2.Translator(model, device="cpu", inter_threads=1, intra_threads=count)
        for width in beams:
            options = {"beam_size": width, "max_decoding_length": new_tokens, "max_batch_size": batch}
            translator.translate_batch(tokens, **options)  # warm-up
            rates = []
            for _ in range(repetitions):
                started = time.perf_counter()
                translator.translate_batch(tokens, **options)
                rates.append(len(tokens) / (time.perf_counter() - started))
            out.append({"runtime": f"ctranslate2 {precision}", "threads": count, "beams": width,
                        "sentences_per_s": statistics.median(rates), "runs": rates})  # fmt: skip
        del translator
    memory = psutil.Process().memory_info().rss / 2**20
    return [row | {"rss_mb": round(memory, 1)} for row in out]
