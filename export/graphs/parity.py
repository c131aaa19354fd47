"""ONNX generator vs the PyTorch reference on a task's test set: token-for-token agreement.

`python -m export.graphs.parity translate` exports the checkpoint's generator, decodes every test
sentence with both (greedy and beam 4), and writes `checkpoints/<task>/parity.json`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import onnxruntime as ort
from tqdm import tqdm

from export.graphs.seq2seq_export import export_generator, generate_onnx
from export.model.checkpoint import write_json
from export.model.reference_search import DEFAULT_SEARCH, ReferenceSearch
from export.training import seq2seq
from export.training.data import DEFAULT_DATA_DIR
from export.training.loop import length_batches, pad_batch
from serving.providers import inference_session


def agreement(
    model,
    session,
    sources: list[list[int]],
    max_new_tokens: int,
    num_beams: int,
    batch_size: int = 32,
    decoding: ReferenceSearch = DEFAULT_SEARCH,
):
    """Fraction of rows where ONNX and PyTorch produce identical token sequences, plus timings."""
    same, seconds = 0, {"onnx": 0.0, "torch": 0.0}
    mismatches = []
    batches = length_batches([len(s) for s in sources], 1 << 30, batch_size, None)
    for batch in tqdm(batches, desc=f"parity beams={num_beams}", unit="batch"):
        ids, mask = pad_batch([sources[i] for i in batch])
        t0 = time.perf_counter()
        got = generate_onnx(session, ids.numpy(), mask.numpy(), max_new_tokens, num_beams, model.cfg)
        t1 = time.perf_counter()
        want = decoding.generate(model, ids, mask, max_new_tokens, num_beams)
        seconds["onnx"] += t1 - t0
        seconds["torch"] += time.perf_counter() - t1
        for i, a, b in zip(batch, got, want, strict=True):
            same += a == b
            if a != b and len(mismatches) < 5:
                mismatches.append({"row": i, "onnx": a, "torch": b})
    return {
        "rows": len(sources),
        "identical": same,
        "agreement": round(same / max(1, len(sources)), 4),
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "mismatch_examples": mismatches,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m export.graphs.parity", description=__doc__.split("\n\n")[0])
    p.add_argument("task", choices=sorted(seq2seq.TASKS))
    p.add_argument("--checkpoint", type=Path, help="default: checkpoints/<task>")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    p.add_argument("--limit", type=int, help="only the first N test examples")
    args = p.parse_args(argv)
    folder = args.checkpoint or Path("checkpoints") / args.task
    model, config, src_tok, tgt_tok = seq2seq.load(folder)
    task = seq2seq.TASKS[args.task]
    _, test_pairs = task.reader(args.data_dir)
    test_pairs = test_pairs[: args.limit] if args.limit else test_pairs
    sources = [s for s, _ in seq2seq.encode_pairs(test_pairs, src_tok, tgt_tok, task)]
    decoding = ReferenceSearch.from_config(config)
    with tempfile.TemporaryDirectory() as tmp:
        path = export_generator(
            model, Path(tmp) / "generator.onnx", max_len=task.max_target_tokens + 1, **asdict(decoding)
        )
        session = inference_session(path)  # CUDA where onnxruntime-gpu has it (serving/providers.py)
        report = {
            "task": args.task,
            "onnxruntime": ort.__version__,
            "providers": session.get_providers(),
            "max_new_tokens": task.max_target_tokens,
            **asdict(decoding),
            "greedy": agreement(model, session, sources, task.max_target_tokens, 1, decoding=decoding),
            "beam4": agreement(model, session, sources, task.max_target_tokens, 4, decoding=decoding),
        }
    write_json(folder / "parity.json", report)
    print({k: v["agreement"] for k, v in report.items() if isinstance(v, dict)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
