"""What a user would pick instead of Triton: the PyTorch sentiment model behind FastAPI + uvicorn.

One request = one forward pass (no batching), the tokenizer the front model uses, the same thread budget
(``torch.set_num_threads`` = usable cores). The endpoint is ``async def`` so forwards run one at a time on the
event loop with all cores each; a plain ``def`` endpoint would run up to 40 forwards at once in the thread
pool and oversubscribe the two cores, which measured no better. Run with
``python -m uvicorn benchmarks.fastapi_app:app`` (``ROPESERVE_BENCH_CHECKPOINT`` picks the checkpoint).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from fastapi import FastAPI
from pydantic import BaseModel

from export import sentiment
from serving.frontends.base import BatchTokenizer
from serving.frontends.sentiment import label_and_score
from serving.ort_backend.session_config import available_cpus


class Review(BaseModel):
    text: str


class Verdict(BaseModel):
    label: str
    score: float


def create_app(checkpoint: Path) -> FastAPI:
    torch.set_num_threads(available_cpus())
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
