"""The keys and values of prompt prefixes that requests share (a task's instruction, a system message, the chat
template's opening), kept so that the next prompt starting the same way skips them: vLLM's automatic prefix
caching, for a decoder-only model.

A prompt is cut into blocks of `block_tokens`. A block's keys depend on every token before it, so a block is named
by a digest of all the tokens up to its end, chained block to block; a lookup walks a prompt's blocks from its
start until one is missing. Blocks are dropped least recently used once the cache passes its byte bound; a
prompt's blocks count as used last to first, so a chain loses its tail before its head, which more prompts share.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

BLOCK_TOKENS = 16


class PrefixCache:
    def __init__(self, max_bytes: int, block_tokens: int = BLOCK_TOKENS) -> None:
        self.max_bytes = max_bytes
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[bytes, NDArray[Any]] = OrderedDict()  # name → [caches, Hkv, block, Dh]
        self.bytes = 0
        self.queried_tokens = 0  # prompt tokens looked up, and those found: the hit rate's two counters
        self.hit_tokens = 0

    def _names(self, tokens: Sequence[int]) -> Iterator[bytes]:
        """The names of the prompt's whole blocks, in order."""
        digest = b""
        ids = np.asarray(tokens, np.int64)
        for end in range(self.block_tokens, len(ids) + 1, self.block_tokens):
            digest = hashlib.blake2b(digest + ids[end - self.block_tokens : end].tobytes(), digest_size=16).digest()
            yield digest

    def lookup(self, tokens: Sequence[int], caches: list[NDArray[Any]]) -> int:
        """Copy the longest cached prefix of `tokens` into row 0 of `caches` (one [1, Hkv, C, Dh] per layer's key
        and value); returns how many tokens it holds (a multiple of the block size)."""
        found = 0
        used = []
        for name in self._names(tokens):
            block = self._blocks.get(name)
            if block is None:
                break
            used.append(name)
            for cache, part in zip(caches, block):
                cache[0, :, found : found + self.block_tokens] = part
            found += self.block_tokens
        self._touch(used)
        self.queried_tokens += len(tokens)
        self.hit_tokens += found
        return found

    def store(self, tokens: Sequence[int], caches: list[NDArray[Any]]) -> None:
        """Keep the whole blocks of `tokens`, whose keys row 0 of `caches` holds, then drop the least recently
        used blocks past the bound (a block larger than the bound is not kept)."""
        names = list(self._names(tokens))
        for index, name in enumerate(names):
            if name not in self._blocks:
                start = index * self.block_tokens
                block = np.stack([cache[0, :, start : start + self.block_tokens] for cache in caches])
                self._blocks[name] = block
                self.bytes += block.nbytes
        self._touch(names)
        while self.bytes > self.max_bytes and self._blocks:
            _, dropped = self._blocks.popitem(last=False)
            self.bytes -= dropped.nbytes

    def _touch(self, names: list[bytes]) -> None:
        """A prompt's blocks used now, its first block last (the most recent)."""
        for name in reversed(names):
            self._blocks.move_to_end(name)
