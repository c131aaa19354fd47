"""The translation section's offline measurements (benchmarks/translation.py drives them): CTranslate2 fp32 and int8,
the ONNX BeamSearch generator and the engine, each on the same sentences at the same batch, beam width and token
budget (benchmarks/ctranslate2_baseline.py's protocol: one warm-up pass, then the median of the timed passes); and
how many steps in a stream's first text becomes certain (:func:`certain_text_steps`)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.profiles import REPOSITORY
from benchmarks.stats import summarize

STREAM_MODEL = "translate_stream"  # the engine's graphs and config, as the streaming twin's front builds it
BATCH = 32
CT2_FP32, CT2_INT8, BEAMSEARCH_OP, ENGINE = "ctranslate2_fp32", "ctranslate2_int8", "onnx_beamsearch", "engine"
RUNTIMES = (CT2_FP32, CT2_INT8, BEAMSEARCH_OP, ENGINE)


def load_engine(threads: int, max_rows: int, folder: Path | None = None) -> tuple[Any, Any]:
    """The engine as the `translate_stream` front model builds it from its version folder (step graphs,
    config.json), and that folder's source tokenizer."""
    from serving.engine.config import EngineConfig
    from serving.engine.engine import Engine
    from serving.frontends.base import BatchTokenizer
    from tasks.definition import EngineSettings

    folder = Path(folder) if folder else REPOSITORY / STREAM_MODEL / "1"
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    settings = EngineSettings(max_rows=max_rows, max_queued_rows=max(max_rows, EngineSettings.max_queued_rows))
    engine = Engine(folder / "encoder.onnx", folder / "decoder.onnx", EngineConfig.from_dict(cfg), threads, settings)
    return engine, BatchTokenizer.from_file(folder / "tokenizer.json", cfg["max_tokens"])


def time_engine(
    sentences: Sequence[str], threads: int, beam_size: int, max_new: int, repeats: int, batch_size: int = BATCH
) -> dict[str, Any]:
    """The engine offline under the CTranslate2 baseline's protocol: every sentence submitted at once,
    ``run_until_idle`` in this thread, at most batch_size sources decoding together (max_rows = batch × beams)."""
    from benchmarks.ctranslate2_baseline import median_throughput
    from serving.engine.engine import Job
    from serving.text.tokenizer import EOS_ID

    engine, tokenizer = load_engine(threads, batch_size * beam_size)
    encoded = tokenizer.encode(list(sentences), suffix=[EOS_ID])  # tokenized beforehand, as for the others
    sources = [encoded.ids[row, : encoded.lengths[row]].tolist() for row in range(len(sentences))]

    def run_all(_: Any) -> list[list[int]]:
        outputs: list[list[int]] = [[] for _ in sources]

        def collect(row: int) -> Callable[[list[int], bool], None]:
            return lambda tokens, final: outputs[row].extend(tokens)

        for row, source in enumerate(sources):
            engine.submit(Job(source, max_new, beam_size, collect(row)))
        engine.run_until_idle()
        engine.stats.queue_seconds.clear()  # only the front model reads these; keep them from piling up
        return outputs

    rates = median_throughput(run_all, [None], repeats)
    return {"threads": threads, "beam_size": beam_size, "batch_size": batch_size, **rates}


def certain_text_steps(sentences: Sequence[str], beams: int, max_new: int) -> dict[str, float]:
    """How soon exact streaming can send anything, before any serving cost: every sentence decoded offline by the
    engine (as `translate_stream` builds it), the step after which a stream's first text is certain (the stream's
    rule: what every live beam and kept hypothesis starts with, `settled_prefix` applied) against its steps in all.
    The median share is a floor under the streaming bar's TTFT ÷ full latency: the encoder and the queue only add
    to both. Medians of the steps and of the per-sentence shares."""
    from tokenizers import Tokenizer

    from serving.engine.engine import Job
    from serving.text.tokenizer import EOS_ID, detokenize, settled_prefix

    folder = REPOSITORY / STREAM_MODEL / "1"
    engine, tokenizer = load_engine(1, BATCH * beams, folder)
    target = Tokenizer.from_file(str(folder / "target_tokenizer.json"))
    encoded = tokenizer.encode(list(sentences), suffix=[EOS_ID])
    first: dict[int, int] = {}
    total: dict[int, int] = {}
    jobs: list[Job] = []

    def collect(row: int) -> Callable[[list[int], object], None]:
        tokens: list[int] = []

        def on_tokens(new: list[int], finish: object) -> None:
            final = finish is not None
            tokens.extend(new)
            steps = jobs[row].sequence.steps
            text = detokenize(target, tokens)
            if row not in first and (final or settled_prefix(text)):
                first[row] = steps
            if final:
                total[row] = steps

        return on_tokens

    for row in range(len(sentences)):
        jobs.append(Job(encoded.ids[row, : encoded.lengths[row]].tolist(), max_new, beams, collect(row)))
        engine.submit(jobs[-1])
    engine.run_until_idle()
    rows = range(len(sentences))
    return {
        "first_text_step_p50": statistics.median(first[row] for row in rows),
        "steps_p50": statistics.median(total[row] for row in rows),
        "first_text_share_p50": statistics.median(first[row] / total[row] for row in rows),
    }


def offline_row(runtime: str, raw: dict[str, Any]) -> dict[str, Any]:
    """A timing of ctranslate2_baseline's shape → a row with the spread of its passes."""
    passes = [s for s in raw["seconds_all"] if s > 0] or [raw["seconds_median"]]
    return {
        "runtime": runtime,
        "threads": raw["threads"],
        "beams": raw["beam_size"],
        "sentences": raw["sentences"],
        "tokens": raw["tokens"],
        "sentences_per_s": summarize([raw["sentences"] / s for s in passes]),
        "tokens_per_s": summarize([raw["tokens"] / s for s in passes]),
    }


def offline(
    sentences: list[str],
    workdir: Path,
    beam_widths: Sequence[int],
    thread_counts: Sequence[int],
    new_tokens: int,
    repeats: int,
) -> list[dict[str, Any]]:
    """Every runtime at every beam width and thread count (RUNTIMES order within each)."""
    from benchmarks import ctranslate2_baseline as ct2

    models = {
        CT2_FP32: ct2.convert(ct2.CHECKPOINT, workdir / "ctranslate2" / "float32"),
        CT2_INT8: ct2.convert(ct2.CHECKPOINT, workdir / "ctranslate2" / "int8", "int8"),
    }

    def timing(runtime: str, threads: int, beams: int) -> dict[str, Any]:
        if runtime in models:
            return ct2.time_translate_batch(models[runtime], sentences, threads, beams, new_tokens, repeats, BATCH)
        if runtime == BEAMSEARCH_OP:
            return ct2.time_onnx_generator(sentences, threads, beams, new_tokens, repeats, BATCH)
        return time_engine(sentences, threads, beams, new_tokens, repeats, BATCH)

    rows = []
    for beams in beam_widths:
        for threads in thread_counts:
            for runtime in RUNTIMES:
                rows.append(offline_row(runtime, timing(runtime, threads, beams)))
    return rows
