"""The step graphs (export/graphs/step_export.py) in ONNX Runtime: the encoder, called for the sources that join
the running batch, and the decoder step, called once per iteration for every row, bound to the batch's buffers.

Everything the engine knows of the model comes from the graphs, as tasks/generation_contract.py lays them out.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from serving.engine.batch import RunningBatch
from serving.providers import in_process_session
from tasks import generation_contract as contract

# What one more encoder call costs beyond its tokens, in padded tokens (see length_groups).
ENCODER_CALL_TOKENS = 32


class StepGraphs:
    def __init__(self, encoder: Path, decoder: Path, threads: int) -> None:
        # CUDA where this onnxruntime has it (serving/providers.py). The caches live in NumPy between steps, and
        # ORT's CUDA GroupQueryAttention takes float16/bfloat16 only, so on a GPU the float32 self-attention runs
        # on the CPU provider and the caches cross over every step: correct, not yet fast (not run here: no GPU).
        self.encoder = in_process_session(encoder, threads)
        self.decoder = in_process_session(decoder, threads)
        self.layout = contract.layout(
            {i.name: i.shape for i in self.decoder.get_inputs()}, {o.name: o.shape for o in self.decoder.get_outputs()}
        )
        self.cross_names = contract.cross_names(self.layout.n_cross)
        self.past_names = contract.self_cache_names("past", self.layout.n_layers)
        self.present_names = contract.self_cache_names("present", self.layout.n_layers)

    def encode_into(self, batch: RunningBatch, sources: list[list[int]], first_row: int) -> None:
        """Encode the sources into the batch's cross-attention rows from `first_row` on. Sources of similar length
        share an encoder call (length_groups), which pads them to its longest only."""
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
        for i, source in enumerate(sources):
            ids[i, : len(source)] = source
        mask = (ids != 0).astype(np.int32)
        return self.encoder.run(self.cross_names, {contract.INPUT_IDS: ids, contract.ATTENTION_MASK: mask}), mask

    def decode(
        self, batch: RunningBatch, with_all_log_probs: bool
    ) -> tuple[NDArray[Any], NDArray[Any], Callable[[], NDArray[Any]] | None]:
        """One decoder step for every row of the batch, each at its own position (the keys it has cached), its new
        keys written in place into the batch's caches. Returns each row's best TOP_K (log-probabilities, token
        ids), and, if `with_all_log_probs`, how to read all its log-probabilities (copied out only on demand)."""
        beams = batch.row_beams()
        positions = np.array([len(beam) - 1 for beam in beams], np.int64)
        caches = batch.caches_for(len(beams), int(positions.max()) + 1)
        cross_mask, cross_keys_values = batch.cross_per_row()
        feeds = {
            contract.INPUT_IDS: np.array([[beam[-1]] for beam in beams], np.int32),
            contract.POSITIONS: positions,
            contract.CROSS_MASK: cross_mask,
            **dict(zip(self.cross_names, cross_keys_values)),
        }
        binding = self.decoder.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)
        wanted = [contract.TOP_LOG_PROBS, contract.TOP_IDS] + ([contract.LOG_PROBS] if with_all_log_probs else [])
        for name in wanted:
            binding.bind_output(name)
        for past, present, cache in zip(self.past_names, self.present_names, caches):
            binding.bind_cpu_input(past, cache)
            binding.bind_output(present, "cpu", 0, np.float32, list(cache.shape), cache.ctypes.data)
        self.decoder.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        return outputs[0].numpy(), outputs[1].numpy(), outputs[2].numpy if with_all_log_probs else None


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
