"""What a user would pick instead of Triton: the PyTorch sentiment model behind FastAPI + uvicorn.

One request = one forward pass (no batching), with the tokenizer the front model uses. The endpoint is
``async def``, so forwards run one at a time on the event loop; a plain ``def`` endpoint would run up to 40
forwards at once in the thread pool and oversubscribe the two cores. Threads: one by default
(``ROPESERVE_BENCH_THREADS``), inside the 2-core budget, because a batch-1 forward with 2 OpenMP threads measured
3-5× slower on this shared machine (see :mod:`benchmarks.threads`), and the event loop needs the other core.
Run with ``python -m uvicorn benchmarks.fastapi_app:app`` (``ROPESERVE_BENCH_CHECKPOINT`` picks the checkpoint).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from fastapi import FastAPI
from pydantic import BaseModel

from export.training import sentiment
from serving.frontends.base import BatchTokenizer
from serving.frontends.sentiment import label_and_score


class Review(BaseModel):
    text: str


class Verdict(BaseModel):
    label: str
    score: float


def create_app(checkpoint: Path) -> FastAPI:
    torch.set_num_threads(int(os.environ.get("ROPESERVE_BENCH_THREADS", "1")))
    model, config, tokenizer = sentiment.load(checkpoint)
    model.eval()
    encoder = BatchTokenizer(tokenizer, config["max_tokens"])
    app = FastAPI(title="sentiment (PyTorch baseline)")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/sentiment")
    async def classify(review: Review) -> Verdict:
        batch = encoder.encode([review.text])
        with torch.inference_mode():
            logits = model(torch.from_numpy(batch.ids), torch.from_numpy(batch.mask)).numpy()
        label, score = label_and_score(logits, config["labels"])[0]
        return Verdict(label=label, score=score)

    return app


app = create_app(
    Path(
        os.environ.get("ROPESERVE_BENCH_CHECKPOINT", Path(__file__).resolve().parents[1] / "checkpoints" / "sentiment")
    )
)
