"""Documents: paragraphs translated whole, against the same sentences one by one.

Quality (``python -m benchmarks.documents``, a minute or two): the Tatoeba test split in file order, cut into
paragraphs of 4 and of 8 consecutive sentences (Chinese joins them without spaces), translated the way
`translate` does on the server (serving/frontends/sentences.py `read`, every piece a row of the engine built from
model_repository/translate/1, the answer joined by the document's layout), greedy and beam 4:

- ``one_by_one``: every sentence its own text (SPLIT_SENTENCES=0, as the checkpoint was scored);
- ``split``: each paragraph one text, SPLIT_SENTENCES=1 (the default);
- ``whole``: each paragraph one text, SPLIT_SENTENCES=0 (the model reads the paragraph, up to its window).

chrF (sacreBLEU) of each paragraph's translation against its sentences' references joined with spaces; for
``one_by_one`` the sentences' translations are joined the same way, so all three are scored on the same units.
The bar: ``split`` at least 0.97x ``one_by_one``. Writes --out (default benchmarks/results/documents_quality.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT.parent / "shared" / "data"
OUT = ROOT / "benchmarks" / "results" / "documents_quality.json"
FOLDER = ROOT / "model_repository" / "translate" / "1"
SIZES = (4, 8)
SEARCHES = (("greedy", 1), ("beam 4", 4))
BAR_QUALITY = 0.97


def test_pairs(data_dir: Path) -> list[tuple[str, str]]:
    """The Tatoeba zh→en test pairs in file order (zh<TAB>en, header first)."""
    path = data_dir / "translation" / "tatoeba_test_zh_en.tsv"
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    return [(zh, en) for zh, en in (line.split("\t")[:2] for line in lines if "\t" in line)]


def paragraphs(items: Sequence[Any], size: int) -> list[list[Any]]:
    """Consecutive runs of ``size`` items; a shorter remainder is left out."""
    return [list(items[i : i + size]) for i in range(0, len(items) - size + 1, size)]


class Translator:
    """`translate` as the front model runs it, offline: documents read as pieces, every piece a row of the engine,
    the answers joined in each document's layout."""

    def __init__(self, folder: Path = FOLDER, threads: int = 1) -> None:
        from tokenizers import Tokenizer

        from benchmarks.translation_offline import load_engine
        from tasks import registry

        self.engine, self.tokenizer = load_engine(threads, 256, folder)
        self.target = Tokenizer.from_file(str(folder / "target_tokenizer.json"))
        self.max_new_tokens = next(o.default for o in registry()["translate"].options if o.keyword == "max_new_tokens")

    def __call__(self, texts: Sequence[str], mode: str, beams: int) -> list[str]:
        from serving.engine.engine import Job
        from serving.frontends import sentences
        from serving.text.tokenizer import EOS_ID, detokenize

        window = self.tokenizer.max_tokens - 1
        documents = [sentences.read(text, mode, window, self.tokenizer.token_ends) for text in texts]
        pieces = [piece for document in documents for piece in document.pieces]
        batch = self.tokenizer.encode(pieces, suffix=[EOS_ID])
        tokens: list[list[int]] = [[] for _ in pieces]

        def collect(row: int) -> Callable[[list[int], bool], None]:
            return lambda new, final: tokens[row].extend(new)

        for row in range(len(pieces)):
            source = batch.ids[row, : batch.lengths[row]].tolist()
            self.engine.submit(Job(source, self.max_new_tokens, beams, collect(row)))
        self.engine.run_until_idle()
        answers = [detokenize(self.target, t) for t in tokens]
        out, start = [], 0
        for document in documents:
            out.append(document.join(answers[start : start + len(document.pieces)]))
            start += len(document.pieces)
        return out


def quality(data_dir: Path, limit: int | None = None) -> dict[str, Any]:
    from export.training.scores import bleu_chrf

    pairs = test_pairs(data_dir)[:limit]
    translate = Translator()
    zh = [p[0] for p in pairs]
    results: dict[str, Any] = {"sentences": len(pairs), "source": "Tatoeba zh-en test split, file order", "rows": []}
    for label, beams in SEARCHES:
        t0 = time.perf_counter()
        single = translate(zh, "0", beams)
        for size in SIZES:
            groups = paragraphs(list(range(len(pairs))), size)
            texts = ["".join(zh[i] for i in group) for group in groups]
            references = [" ".join(pairs[i][1] for i in group) for group in groups]
            scores = {"one_by_one": bleu_chrf([" ".join(single[i] for i in group) for group in groups], references)}
            for name, mode in (("split", "1"), ("whole", "0")):
                scores[name] = bleu_chrf(translate(texts, mode, beams), references)
            base = scores["one_by_one"]["chrf"]
            results["rows"].append(
                {
                    "search": label,
                    "sentences_per_paragraph": size,
                    "paragraphs": len(groups),
                    **{name: score["chrf"] for name, score in scores.items()},
                    "split_ratio": round(scores["split"]["chrf"] / base, 3),
                    "whole_ratio": round(scores["whole"]["chrf"] / base, 3),
                    "bar": BAR_QUALITY,
                    "met": scores["split"]["chrf"] >= BAR_QUALITY * base,
                }
            )
        print(f"{label}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return results


def quality_table(results: dict[str, Any]) -> list[str]:
    lines = [
        "| search | sentences per paragraph | paragraphs | chrF one by one | chrF split (default) | ratio | "
        "chrF whole (SPLIT_SENTENCES=0) | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["rows"]:
        lines.append(
            f"| {r['search']} | {r['sentences_per_paragraph']} | {r['paragraphs']} | {r['one_by_one']:.1f} | "
            f"{r['split']:.1f} | {r['split_ratio']:.3f}{'' if r['met'] else ' (missed)'} | {r['whole']:.1f} | "
            f"{r['whole_ratio']:.3f} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.documents",
        description="chrF of Tatoeba test paragraphs (4 and 8 sentences) translated as `translate` does, against "
        "the same sentences one by one; needs `make repository` (the engine's step graphs).",
    )
    p.add_argument("--data-dir", type=Path, default=DATA_DIR, help="default: %(default)s")
    p.add_argument("--limit", type=int, default=None, help="first N test sentences (default: all)")
    p.add_argument("--out", type=Path, default=OUT, help="default: %(default)s")
    args = p.parse_args(argv)
    results = quality(args.data_dir, args.limit)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print("\n".join(quality_table(results)))
    return 0 if all(r["met"] for r in results["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())


# -- the bench section: documents served --------------------------------------------------------------------
#
# `python -m benchmarks --sections documents`, in one run on one machine:
# 1. offline, CTranslate2 fp32 (the peer) on the sentences the paragraphs are split into (this module's
#    splitter, as the server splits them), batch 32, greedy and beam 4, at its better thread count;
# 2. served, closed loop at the largest translation client count: the same test sentences as paragraphs of 8
#    (one request each) and as single texts, interleaved; sentences per second = requests per second x the
#    paragraph's pieces;
# 3. fairness: one client sending single sentences, alone (idle) and beside FAIRNESS_CLIENTS clients that send
#    FAIRNESS_SENTENCES-sentence documents; its p50 latency loaded / idle.

PARAGRAPH = 8
FAIRNESS_CLIENTS, FAIRNESS_SENTENCES = 4, 50
BAR_VS_CT2, BAR_VS_SINGLES, BAR_FAIRNESS = 1.0, 1.0, 2.0


def split_pieces(texts: Sequence[str]) -> list[list[str]]:
    """Each text's pieces as the server cuts them (split mode 1, translate's window)."""
    from serving.frontends import sentences
    from serving.frontends.base import BatchTokenizer

    config = json.loads((FOLDER / "config.json").read_text(encoding="utf-8"))
    tokenizer = BatchTokenizer.from_file(FOLDER / "tokenizer.json", config["max_tokens"])
    window = tokenizer.max_tokens - 1
    return [list(sentences.read(text, "1", window, tokenizer.token_ends).pieces) for text in texts]


def _ct2_offline(profile: Any, pieces: list[str], workdir: Path) -> list[dict[str, Any]]:
    from benchmarks import ctranslate2_baseline as ct2
    from benchmarks.translation import BEAMS, max_new_tokens
    from benchmarks.translation_offline import BATCH, CT2_FP32, offline_row

    model = ct2.convert(ct2.CHECKPOINT, workdir / "ctranslate2" / "float32")
    rows = []
    for beams in BEAMS:
        for threads in profile.translation_threads:
            raw = ct2.time_translate_batch(
                model, pieces, threads, beams, max_new_tokens(profile), profile.repetitions, BATCH
            )
            rows.append(offline_row(CT2_FP32, raw))
    return rows


def _fairness(url: str, singles: list[str], documents: list[str], profile: Any, beams: int) -> dict[str, Any]:
    """The single-sentence client's latency alone, then beside the document clients (same window)."""
    import threading

    from benchmarks.closed_loop import closed_loop
    from benchmarks.translation import TASK, max_new_tokens

    new_tokens, window, warmup = max_new_tokens(profile), profile.translation_seconds, profile.translation_warmup_s
    idle = closed_loop(url, TASK, singles, 1, beams, new_tokens, window, warmup)
    loaded: dict[str, Any] = {}

    def documents_load() -> None:
        loaded["documents"] = closed_loop(
            url, TASK, documents, FAIRNESS_CLIENTS, beams, new_tokens, window + 2 * warmup, warmup
        )

    background = threading.Thread(target=documents_load, daemon=True)
    background.start()
    time.sleep(2 * warmup)  # the documents are decoding before the window opens
    loaded["singles"] = closed_loop(url, TASK, singles, 1, beams, new_tokens, window, 0.0)
    background.join()
    return {
        "beams": beams,
        "idle": idle,
        "loaded": loaded["singles"],
        "documents": loaded["documents"],
        "p50_ratio": loaded["singles"]["p50_ms"] / idle["p50_ms"],
    }


def measure(profile: Any, workdir: Path) -> dict[str, Any]:
    import contextlib
    from functools import partial

    from benchmarks.closed_loop import closed_loop, start_server
    from benchmarks.stats import interleaved, summarize_runs
    from benchmarks.translation import BEAMS, REPOSITORY, TASK, beam_label, cpu_info, max_new_tokens, test_sentences

    singles, source = test_sentences(profile)
    groups = paragraphs(singles, PARAGRAPH) or [list(singles)]
    texts = ["".join(group) for group in groups]
    cut = split_pieces(texts)
    pieces_per_text = sum(len(p) for p in cut) / len(cut)
    long_documents = [
        "".join(singles[(i * FAIRNESS_SENTENCES + j) % len(singles)] for j in range(FAIRNESS_SENTENCES))
        for i in range(FAIRNESS_CLIENTS)
    ]
    section: dict[str, Any] = {
        "sentences": len(singles),
        "texts_source": source,
        "sentences_per_paragraph": PARAGRAPH,
        "paragraphs": len(texts),
        "pieces_per_paragraph": pieces_per_text,
        "clients": max(profile.translation_clients),
        "window_s": profile.translation_seconds,
        "max_new_tokens": max_new_tokens(profile),
        "cpu": cpu_info(),
    }
    section["offline"] = _ct2_offline(profile, [p for text in cut for p in text], workdir)
    new_tokens, window, warmup = section["max_new_tokens"], profile.translation_seconds, profile.translation_warmup_s
    clients = section["clients"]
    with contextlib.ExitStack() as stack:
        server = start_server(stack, REPOSITORY, [TASK])
        for beams in BEAMS:
            closed_loop(server.grpc_url, TASK, texts, 2, beams, new_tokens, max(0.5, warmup), 0.0)
        served = []
        for beams in BEAMS:
            calls = {
                name: partial(closed_loop, server.grpc_url, TASK, sent, clients, beams, new_tokens, window, warmup)
                for name, sent in (("paragraphs", texts), ("singles", singles))
            }
            runs = interleaved(calls, profile.repetitions, desc=f"documents c{clients} {beam_label(beams)}")
            for run in runs["paragraphs"]:
                run["sentences_per_s"] = run["throughput"] * pieces_per_text
            for run in runs["singles"]:
                run["sentences_per_s"] = run["throughput"]
            served.append({"beams": beams, **{name: summarize_runs(r) for name, r in runs.items()}})
        section["served"] = served
        section["fairness"] = _fairness(server.grpc_url, singles, long_documents, profile, max(BEAMS))
    section["bars"] = bars(section)
    return section


def bars(section: dict[str, Any]) -> list[dict[str, Any]]:
    """Per search: paragraphs served vs CTranslate2 offline and vs single texts; then fairness (checks entries)."""
    from benchmarks.checks import check
    from benchmarks.translation import beam_label

    out = []
    for point in section["served"]:
        label = beam_label(point["beams"])
        ct2 = _best_ct2(section, point["beams"])
        paragraphs_rate = point["paragraphs"]["sentences_per_s"]["median"]
        singles_rate = point["singles"]["sentences_per_s"]["median"]
        out += [
            check(
                f"paragraphs of {PARAGRAPH} served ≥ 1.0× CTranslate2 offline on their sentences ({label})",
                paragraphs_rate / ct2,
                BAR_VS_CT2,
            ),
            check(
                f"paragraphs of {PARAGRAPH} served ≥ 1.0× the same sentences as single texts ({label})",
                paragraphs_rate / singles_rate,
                BAR_VS_SINGLES,
            ),
        ]
    fair = section["fairness"]
    out.append(
        check(
            f"single-sentence p50 beside {FAIRNESS_CLIENTS} clients of {FAIRNESS_SENTENCES}-sentence documents "
            f"≤ 2× idle ({beam_label(fair['beams'])})",
            fair["p50_ratio"],
            BAR_FAIRNESS,
            higher_is_better=False,
        )
    )
    return out


def _best_ct2(section: dict[str, Any], beams: int) -> float:
    """CTranslate2's median sentences/s at its better thread count."""
    return max(r["sentences_per_s"]["median"] for r in section["offline"] if r["beams"] == beams)


def markdown(section: dict[str, Any]) -> list[str]:
    from benchmarks.markdown import table
    from benchmarks.translation import beam_label

    lines = [
        "## 7. Documents: paragraphs served whole",
        "",
        f"{section['paragraphs']} paragraphs of {section['sentences_per_paragraph']} consecutive sentences "
        f"({section['texts_source']}; {section['pieces_per_paragraph']:.2f} pieces each after splitting), "
        f"{section['clients']} gRPC clients, {section['window_s']:g} s windows; CTranslate2 fp32 offline on the "
        "same split sentences (batch 32, its better thread count). Sentences per second, median [min–max].",
        "",
    ]
    rows = []
    for point in section["served"]:
        beams = point["beams"]
        ct2 = _best_ct2(section, beams)

        def cell(stats: dict[str, float]) -> str:
            return f"{stats['median']:.1f} [{stats['min']:.1f}–{stats['max']:.1f}]"

        rows.append(
            [
                beam_label(beams),
                f"{ct2:.1f}",
                cell(point["paragraphs"]["sentences_per_s"]),
                cell(point["singles"]["sentences_per_s"]),
                f"{point['paragraphs']['p50_ms']['median']:.0f} / {point['paragraphs']['p99_ms']['median']:.0f}",
                f"{point['singles']['p50_ms']['median']:.0f} / {point['singles']['p99_ms']['median']:.0f}",
            ]
        )
    lines += table(
        [
            "search",
            "CTranslate2 offline",
            "served as paragraphs",
            "served as single texts",
            "paragraph p50 / p99 ms",
            "single p50 / p99 ms",
        ],
        rows,
    )
    fair = section["fairness"]
    lines += [
        "",
        f"Fairness ({beam_label(fair['beams'])}): one client of single sentences, p50 {fair['idle']['p50_ms']:.1f} ms "
        f"alone and {fair['loaded']['p50_ms']:.1f} ms beside {FAIRNESS_CLIENTS} clients of {FAIRNESS_SENTENCES}-"
        f"sentence documents ({fair['p50_ratio']:.2f}×; the documents: "
        f"{fair['documents']['throughput'] * FAIRNESS_SENTENCES:.0f} sentences/s).",
        "",
    ]
    refusals = sum(p[name]["refusals"]["median"] for p in section["served"] for name in ("paragraphs", "singles"))
    if refusals:
        lines += [
            f"Overload refusals, retried with the SDK's backoff (median per window, summed over the rows): "
            f"{refusals:g}; the bound is the engine's backlog (max_queued_rows, the [engine] table of "
            "tasks/translate.toml).",
            "",
        ]
    return lines
