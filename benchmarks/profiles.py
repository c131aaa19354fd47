"""How long and how often to measure: `full` for BENCHMARKS.md, `quick` for a look, `smoke` for the tests."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from export.training.data import DEFAULT_DATA_DIR

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ROOT / "checkpoints"
REPOSITORY = ROOT / "model_repository"
SECTIONS = ("ceiling", "runtime", "generation", "serving", "translation", "documents", "imported", "llm", "gateway")


@dataclass(frozen=True)
class Profile:
    name: str
    repetitions: int  # interleaved repetitions of every measurement
    min_time_s: float  # per model-runtime measurement
    batches: tuple[int, ...] = (1, 8, 32)
    sequences: tuple[int, ...] = (32, 128)
    accuracy_limit: int | None = None  # sentiment test sentences for accuracy (None: the whole split)
    generation_batches: tuple[int, ...] = (1, 8)
    generation_sentences: int = 16  # test sentences per generation measurement (cycled into batches)
    generation_new_tokens: int | None = None  # None: the task's served default
    concurrencies: tuple[int, ...] = (1, 8, 32)
    window_ms: int = 2000  # perf_analyzer measurement window
    client_seconds: float = 4.0  # async-client measurement per point (after a 0.5 s warm-up)
    serving_texts: int = 200  # test sentences sent to the servers
    translation_sentences: int = 320  # Tatoeba test sentences, file order (offline passes, served requests)
    translation_new_tokens: int | None = None  # None: the served default (48)
    translation_threads: tuple[int, ...] = (1, 2)  # offline intra-op threads
    translation_clients: tuple[int, ...] = (16, 32)  # closed-loop gRPC clients
    translation_stream_clients: int = 16
    translation_seconds: float = 10.0  # served window per point
    translation_warmup_s: float = 2.0  # before each window, not counted
    data_dir: Path = DEFAULT_DATA_DIR

    def to_dict(self) -> dict[str, Any]:
        return {key: (str(value) if isinstance(value, Path) else value) for key, value in asdict(self).items()}


PROFILES = {
    "full": Profile("full", repetitions=3, min_time_s=1.0),
    "quick": Profile(
        "quick",
        repetitions=1,
        min_time_s=0.2,
        accuracy_limit=400,
        generation_sentences=8,
        window_ms=800,
        client_seconds=1.2,
        translation_sentences=32,
        translation_seconds=2.0,
        translation_warmup_s=1.0,
    ),
    "smoke": Profile(
        "smoke",
        repetitions=1,
        min_time_s=0.02,
        batches=(1, 8),
        sequences=(32,),
        accuracy_limit=32,
        generation_batches=(2,),
        generation_sentences=2,
        generation_new_tokens=4,
        concurrencies=(1, 4),
        window_ms=500,
        client_seconds=0.5,
        serving_texts=16,
        translation_sentences=8,
        translation_seconds=2.0,  # longer than a beam-4 answer of the previous setup at 32 clients (~1.2 s)
        translation_warmup_s=1.0,
    ),
}


def profile(name: str, data_dir: Path | None = None) -> Profile:
    base = PROFILES[name]
    return replace(base, data_dir=Path(data_dir)) if data_dir else base
