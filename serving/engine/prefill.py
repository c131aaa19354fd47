"""A decoder-only model's prompts read into their caches a chunk at a time, beside the running batch's decode
steps (chunked prefill), their shared prefixes copied from the prefix cache instead of computed.

A prompt waits here, in a cache of its own (one row, as wide as the prompt), until the keys of all its tokens but
the last are there; the last is the running batch's to feed, as its first decode step. Then it joins the batch:
its row is copied into its beams' rows, and its whole blocks go into the prefix cache.

Each engine step reads at most `chunk_tokens` prompt tokens, so a long prompt takes several steps and the running
rows keep decoding between them: prompts with nothing cached yet share one call (right-padded to the longest
piece), prompts that hold keys continue one per call (the contract's rule: ONNX Runtime's GroupQueryAttention
continues a cache with several tokens for one row at a time). On a CPU a chunk of tens of tokens is bound by its
arithmetic, not by reading the weights, so one row per call costs little. Prompts go first come, first served.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from serving.engine.job import Job
from serving.engine.prefix_cache import BLOCK_TOKENS, PrefixCache

# Runs the step graph over `ids` [rows, S] at `positions` [rows], writing their keys into `caches` in place.
Extend = Callable[[list[NDArray[Any]], NDArray[Any], NDArray[Any]], None]


@dataclass(eq=False)
class Prompt:
    job: Job
    caches: list[NDArray[Any]]  # [1, Hkv, columns, Dh] per layer's key and value
    done: int = 0  # tokens whose keys are in the caches

    @property
    def tokens(self) -> list[int]:
        return self.job.source[:-1]  # the last is the first decode step's

    @property
    def left(self) -> int:
        return len(self.tokens) - self.done


class Prefill:
    def __init__(
        self, extend: Extend, cache_shape: tuple[int, int, int], chunk_tokens: int, prefix_cache: PrefixCache | None
    ) -> None:
        """`cache_shape`: caches (2 per layer), key/value heads, head size."""
        self.extend = extend
        self.caches, self.heads, self.head_dim = cache_shape
        self.chunk_tokens = chunk_tokens
        self.prefix_cache = prefix_cache
        self.prompts: list[Prompt] = []

    @property
    def jobs(self) -> list[Job]:
        return [prompt.job for prompt in self.prompts]

    def add(self, jobs: list[Job]) -> None:
        """Prompts to read, each with what the prefix cache holds of it already."""
        for job in jobs:
            columns = -(-max(len(job.source), 1) // BLOCK_TOKENS) * BLOCK_TOKENS
            caches = [np.zeros((1, self.heads, columns, self.head_dim), np.float32) for _ in range(self.caches)]
            prompt = Prompt(job, caches)
            if self.prefix_cache is not None:
                prompt.done = self.prefix_cache.lookup(prompt.tokens, caches)
            self.prompts.append(prompt)

    def step(self) -> list[Prompt]:
        """One step's share of reading; returns the prompts now read whole (they leave)."""
        budget = self.chunk_tokens
        fresh = [prompt for prompt in self.prompts if prompt.done == 0 and prompt.left]
        if fresh:
            budget -= self._fresh_call(fresh, budget)
        for prompt in self.prompts:
            if budget <= 0:
                break
            if prompt.done and prompt.left:
                piece = min(prompt.left, budget)
                ids = np.array([prompt.tokens[prompt.done : prompt.done + piece]], np.int32)
                self.extend(prompt.caches, ids, np.array([prompt.done], np.int64))
                prompt.done += piece
                budget -= piece
        read = [prompt for prompt in self.prompts if not prompt.left]
        self.prompts = [prompt for prompt in self.prompts if prompt.left]
        if self.prefix_cache is not None:
            for prompt in read:
                self.prefix_cache.store(prompt.tokens, prompt.caches)
        return read

    def _fresh_call(self, fresh: list[Prompt], budget: int) -> int:
        """The first pieces of prompts with nothing cached, in one call: as many prompts, first come first, as fit
        in `budget` padded to their longest piece. Returns the tokens it cost (padding included)."""
        taken: list[Prompt] = []
        width = 0
        for prompt in fresh:
            wider = max(width, min(prompt.left, budget))
            if taken and (len(taken) + 1) * wider > budget:
                break
            taken.append(prompt)
            width = wider
        ids = np.zeros((len(taken), width), np.int32)
        for row, prompt in enumerate(taken):
            piece = prompt.tokens[:width]
            ids[row, : len(piece)] = piece
        shape = (len(taken), self.heads, width, self.head_dim)
        caches = [np.zeros(shape, np.float32) for _ in range(self.caches)]  # empty: nothing to copy in
        self.extend(caches, ids, np.zeros(len(taken), np.int64))
        for row, prompt in enumerate(taken):
            done = min(width, len(prompt.tokens))
            for mine, batched in zip(prompt.caches, caches):
                mine[0, :, :done] = batched[row, :, :done]
            prompt.done = done
        return len(taken) * width

    def drop(self, leaving: Callable[[Job], bool]) -> list[Job]:
        """The waiting prompts' jobs that `leaving` names, taken out."""
        gone = [prompt.job for prompt in self.prompts if leaving(prompt.job)]
        self.prompts = [prompt for prompt in self.prompts if not leaving(prompt.job)]
        return gone

    def clear(self) -> list[Job]:
        jobs, self.prompts = self.jobs, []
        return jobs
