"""The step graphs (export/graphs/step_export.py) in ONNX Runtime: the encoder, called for the sources that join
the running batch, and the decoder step, called once per iteration for every row, bound to the batch's buffers.
A decoder-only model has the step alone, which also reads its prompts, a chunk at a time (`extend`).

Everything the engine knows of the model comes from the graphs, as tasks/generation_contract.py lays them out.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from serving.engine.batch import RunningBatch
from serving.engine.job import Job
from serving.providers import in_process_session
from tasks import generation_contract as contract

# What one more encoder call costs beyond its tokens, in padded tokens (see length_groups).
ENCODER_CALL_TOKENS = 32


class StepGraphs:
    def __init__(self, encoder: Path | None, decoder: Path, threads: int) -> None:
        """`encoder`: None for a decoder-only model."""
        # CUDA where this onnxruntime has it (serving/providers.py). The caches live in NumPy between steps, and
        # ORT's CUDA GroupQueryAttention takes float16/bfloat16 only, so on a GPU the float32 self-attention runs
        # on the CPU provider and the caches cross over every step: correct, not yet fast (not run here: no GPU).
        self.encoder = None if encoder is None else in_process_session(encoder, threads)
        self.decoder = in_process_session(decoder, threads)
        self.layout = contract.layout(
            {i.name: i.shape for i in self.decoder.get_inputs()}, {o.name: o.shape for o in self.decoder.get_outputs()}
        )
        if (encoder is None) != self.layout.decoder_only:
            raise ValueError(f"{decoder}: a decoder-only step goes without an encoder, a cross-attending one with it")
        self.cross_names = contract.cross_names(self.layout.n_cross)
        self.past_names = contract.self_cache_names("past", self.layout.n_layers)
        self.present_names = contract.self_cache_names("present", self.layout.n_layers)

    def encode_into(self, batch: RunningBatch, jobs: list[Job], first_row: int) -> None:
        """Encode the jobs' sources into the batch's cross-attention rows from `first_row` on. Sources of similar
        length share an encoder call (length_groups), which pads them to its longest only."""
        sources = [job.source for job in jobs]
        for group in length_groups([len(source) for source in sources], ENCODER_CALL_TOKENS):
            outputs, mask = self.encode([sources[i] for i in group])
            rows = [first_row + i for i in group]
            columns = mask.shape[1]
            for buffer, output in zip(batch.cross, outputs):
                buffer[rows, :, :columns] = output
            batch.cross_mask[rows, :columns] = mask

    def encode(self, sources: list[list[int]]) -> tuple[list[NDArray[Any]], NDArray[Any]]:
        """One encoder call, padded to the longest source: the cross-attention keys/values, and the mask."""
        ids = np.zeros((len(sources), max(map(len, sources))), np.int32)
        mask = np.zeros_like(ids)
        for i, source in enumerate(sources):
            ids[i, : len(source)] = source
            mask[i, : len(source)] = 1
        feeds = {contract.INPUT_IDS: ids, contract.ATTENTION_MASK: mask}
        if self.encoder is None:
            raise RuntimeError("a decoder-only model has no encoder")
        return self.encoder.run(self.cross_names, feeds), mask

    def extend(self, caches: list[NDArray[Any]], ids: NDArray[Any], positions: NDArray[Any]) -> None:
        """A decoder-only model reads `ids` [rows, S] (prompt pieces, right-padded) at `positions` [rows], their
        keys written in place into `caches` [rows, Hkv, C, Dh] (C ≥ max(positions) + S); nothing else is read."""
        binding = self.decoder.io_binding()
        binding.bind_cpu_input(contract.INPUT_IDS, ids)
        binding.bind_cpu_input(contract.POSITIONS, positions)
        binding.bind_output(contract.TOP_IDS)  # the graph computes them; they are not read
        binding.bind_output(contract.TOP_LOG_PROBS)
        binding.bind_output(contract.LOG_PROBS)
        self._bind_caches(binding, caches)
        self.decoder.run_with_iobinding(binding)

    def decode(
        self, batch: RunningBatch, with_all_log_probs: bool
    ) -> tuple[NDArray[Any], NDArray[Any], Callable[[], NDArray[Any]] | None]:
        """One decoder step for every row of the batch, each at its own position (the keys it has cached), its new
        keys written in place into the batch's caches. Returns each row's best TOP_K (log-probabilities, token
        ids), and, if `with_all_log_probs`, how to read all its log-probabilities (copied out only on demand)."""
        beams = batch.row_beams()
        positions = np.array([len(beam) - 1 for beam in beams], np.int64)
        caches = batch.caches_for(len(beams), int(positions.max()) + 1)
        feeds = {
            contract.INPUT_IDS: np.array([[beam[-1]] for beam in beams], np.int32),
            contract.POSITIONS: positions,
        }
        if not self.layout.decoder_only:
            cross_mask, cross_keys_values = batch.cross_per_row()
            feeds[contract.CROSS_MASK] = cross_mask
            feeds.update(zip(self.cross_names, cross_keys_values))
        binding = self.decoder.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)
        wanted = [contract.TOP_LOG_PROBS, contract.TOP_IDS] + ([contract.LOG_PROBS] if with_all_log_probs else [])
        for name in wanted:
            binding.bind_output(name)
        self._bind_caches(binding, caches)
        self.decoder.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        return outputs[0].numpy(), outputs[1].numpy(), outputs[2].numpy if with_all_log_probs else None

    def _bind_caches(self, binding: Any, caches: list[NDArray[Any]]) -> None:
        """Each past bound to its buffer, and its present to the same memory: the new keys are written in place."""
        for past, present, cache in zip(self.past_names, self.present_names, caches):
            binding.bind_cpu_input(past, cache)
            binding.bind_output(present, "cpu", 0, np.float32, list(cache.shape), cache.ctypes.data)


def length_groups(lengths: list[int], call_cost: int) -> list[list[int]]:
    """The indices of `lengths` cut into groups, one encoder call each, that cost least in all: a call pads its
    sources to its longest and costs `call_cost` tokens more by itself. Groups are runs of the sorted lengths,
    so the best cut is found by dynamic programming over where each run starts."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    cost = [0.0] + [float("inf")] * len(order)  # cost[end]: the cheapest cut of the `end` shortest
    start_of = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        longest = lengths[order[end - 1]]
        for start in range(end):
            total = cost[start] + call_cost + (end - start) * longest
            if total < cost[end]:
                cost[end], start_of[end] = total, start
    groups, end = [], len(order)
    while end:
        groups.append(order[start_of[end] : end])
        end = start_of[end]
    return groups[::-1]
