"""The running batch: its jobs in row order (`num_beams` rows each) and the buffers that outlive the steps.

- Self-attention caches [rows, H, columns, Dh]: row r's keys fill columns 0..positions[r]-1, and the decoder
  writes each new key in place (its present bound to the buffer's memory). Between steps only rows that move are
  copied (a beam that continues another beam, the last source moving into the place a finished one left), never
  the whole cache; a newcomer's rows need nothing copied at all.
- Cross-attention keys/values [sources, H, columns, Dh] and their mask [sources, columns], one row per source
  (not per beam), in job order: a finished source's row is taken by the last source's, and the encoder's output
  goes straight into the newcomers' rows. Their width is the longest running source rounded up to
  CROSS_COLUMNS_STEP tokens, kept while it fits, so it changes (a copy of every row) only when a longer source
  arrives or the running ones fit in half of it.

A decoder-only model has no cross-attention: a newcomer's prompt is prefilled straight into its rows' caches.

The batch knows rows and buffers, not models or searches: the engine (serving/engine/engine.py) tells it who
joins, and which rows each continuing source's next step reads (`leave`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from serving.engine.job import Job
from tasks.generation_contract import Layout

# The cross-attention buffers' width grows and shrinks in steps of this many source tokens.
CROSS_COLUMNS_STEP = 16

# Reads the admitted jobs' sources into the batch: an encoder writes cross-attention rows from this source's on, a
# decoder-only model's prefill the self-attention caches of their beams' rows from this row on.
EncodeInto = Callable[[list[Job], int], None]


class RunningBatch:
    def __init__(self, layout: Layout) -> None:
        h, d = layout.n_heads, layout.head_dim
        self.decoder_only = layout.decoder_only
        self.jobs: list[Job] = []  # in row order
        self.caches = [np.zeros((8, h, 16, d), np.float32) for _ in range(2 * layout.n_layers)]
        self.cross = [np.zeros((8, h, CROSS_COLUMNS_STEP, d), np.float32) for _ in range(2 * layout.n_cross)]
        self.cross_mask = np.zeros((8, CROSS_COLUMNS_STEP), np.int32)
        self._forget_moves()

    @property
    def rows(self) -> int:
        return sum(job.num_beams for job in self.jobs)

    def clear(self) -> list[Job]:
        """Empty it (after a failed step); returns the jobs it held."""
        jobs, self.jobs = self.jobs, []
        self._forget_moves()
        return jobs

    def _forget_moves(self) -> None:
        # What the last step left to do before the next: self-attention rows to copy (destination rows, source
        # rows, columns in use) and the sources that continue, in their new order (None: all, in order).
        self._moves: tuple[list[int], list[int], int] | None = None
        self._order: list[int] | None = None

    # -- before a step -------------------------------------------------------------------------------------------
    def join(self, admitted: list[Job], encode_into: EncodeInto) -> None:
        """Carry out the last step's moves, then the admitted jobs take the rows after the running ones."""
        self._move_cache_rows()
        if self.decoder_only:
            self._order = None  # no cross-attention rows to move
            if admitted:
                first_row = self.rows
                self.jobs += admitted
                encode_into(admitted, first_row)
            return
        if not admitted and self._order is None:
            return
        self._move_sources()
        kept = len(self.jobs)
        self.jobs += admitted
        widest = max((len(job.source) for job in self.jobs), default=1)
        self._reserve_cross(len(self.jobs), widest, kept)
        if admitted:
            self.cross_mask[kept : len(self.jobs)] = 0
            encode_into(admitted, kept)

    def _move_cache_rows(self) -> None:
        """The last step's beam reorders and departures: each row that moves is copied (the columns in use)."""
        if self._moves is None:
            return
        destinations, origins, columns = self._moves
        for buffer in self.caches:
            buffer[destinations, :, :columns] = buffer[origins, :, :columns]  # the right side is read first
        self._moves = None

    def _move_sources(self) -> None:
        """The continuing sources' cross-attention rows into their new places (only those whose place changes)."""
        order, self._order = self._order, None
        if order is None:
            return
        moving = [(to, of) for to, of in enumerate(order) if to != of]
        if moving:
            destinations, origins = (list(side) for side in zip(*moving))
            for buffer in (*self.cross, self.cross_mask):
                buffer[destinations] = buffer[origins]  # the right side is read first

    def _reserve_cross(self, rows: int, widest: int, kept: int) -> None:
        """Cross-attention buffers of at least `rows` rows and a width that holds `widest` source tokens: grown by
        doubling rows and in steps of CROSS_COLUMNS_STEP columns; narrowed once the running sources fit in half
        the width (every column is attended to, masked or not). The first `kept` rows are kept."""
        have_rows, _, columns, _ = self.cross[0].shape
        needed = -(-widest // CROSS_COLUMNS_STEP) * CROSS_COLUMNS_STEP
        if needed > columns or needed <= columns // 2:
            columns = needed
        elif rows <= have_rows:
            return
        rows = doubled(have_rows, rows)
        self.cross = [resized(buffer, rows, columns, kept) for buffer in self.cross]
        mask, keep = np.zeros((rows, columns), np.int32), min(columns, self.cross_mask.shape[1])
        mask[:kept, :keep] = self.cross_mask[:kept, :keep]
        self.cross_mask = mask

    # -- the step's inputs ---------------------------------------------------------------------------------------
    def row_beams(self) -> list[list[int]]:
        """Each row's tokens so far (starting with the decoder's start token)."""
        return [beam for job in self.jobs for beam in job.state.row_beams()]

    def caches_for(self, rows: int, columns: int) -> list[NDArray[Any]]:
        """The self-attention caches' leading `rows` rows (contiguous), grown first to hold `columns` keys."""
        have_rows, _, have_columns, _ = self.caches[0].shape
        if rows > have_rows or columns > have_columns:
            rows_to, columns_to = doubled(have_rows, rows), doubled(have_columns, columns)
            self.caches = [resized(buffer, rows_to, columns_to, have_rows) for buffer in self.caches]
        return [buffer[:rows] for buffer in self.caches]

    def cross_per_row(self) -> tuple[NDArray[Any], list[NDArray[Any]]]:
        """The cross-attention mask and keys/values the step reads: one row per source while every source has
        the same beam width (the graph groups rows by source), else repeated per row."""
        sources = len(self.jobs)
        mask, keys_values = self.cross_mask[:sources], [buffer[:sources] for buffer in self.cross]
        widths = [job.num_beams for job in self.jobs]
        if min(widths) != max(widths):
            mask, *keys_values = (np.repeat(array, widths, axis=0) for array in (mask, *keys_values))
        return mask, keys_values

    def starts(self) -> NDArray[Any]:
        """The first row of each job, and the row count at the end."""
        return np.cumsum([0] + [job.num_beams for job in self.jobs])

    # -- after a step ----------------------------------------------------------------------------------------------
    def leave(self, leaving: set[int], parents: Sequence[list[int]]) -> None:
        """The jobs at `leaving` (indices) leave; each other job's next rows continue `parents[job]` of its rows.
        Notes the row copies this makes, carried out before the next step (`join`)."""
        starts = self.starts().tolist()
        order = self._fill_gaps([index for index in range(len(self.jobs)) if index not in leaving], starts)
        destinations: list[int] = []
        origins: list[int] = []
        columns = 0  # of the moving rows' caches in use
        row = 0  # where the next continuing source's rows start
        for index in order:
            job, start = self.jobs[index], starts[index]
            moved = [(row + j, start + p) for j, p in enumerate(parents[index]) if row + j != start + p]
            if moved:
                destinations += [to for to, _ in moved]
                origins += [of for _, of in moved]
                columns = max(columns, job.state.cached_columns)
            row += job.num_beams
        self._moves = (destinations, origins, columns) if destinations else None
        self._order = None if order == list(range(len(self.jobs))) else order
        self.jobs = [self.jobs[index] for index in order]
        if not self.jobs:
            self._forget_moves()

    def _fill_gaps(self, staying: list[int], starts: list[int]) -> list[int]:
        """The order of the continuing jobs in the next step's rows. With one beam width, the jobs whose rows lie
        beyond the new end fill the places of those that left, and the others stay put: a finished source costs
        at most its own width in row copies, not a shift of every row after it. Mixed widths keep their order.
        The moves are worked out from the rows' actual places, so any order is correct; this one copies least."""
        widths = {self.jobs[index].num_beams for index in staying}
        if len(widths) != 1:
            return staying
        width = widths.pop()
        places = {starts[index] // width: index for index in staying}
        holes = (place for place in range(len(staying)) if place not in places)
        for place in sorted(place for place in places if place >= len(staying)):
            places[next(holes)] = places.pop(place)
        return [places[place] for place in range(len(staying))]


def doubled(have: int, need: int) -> int:
    """A buffer's new size along one axis: as it is while `need` fits, else at least twice as large."""
    return have if need <= have else max(need, 2 * have)


def resized(buffer: NDArray[Any], rows: int, columns: int, kept_rows: int) -> NDArray[Any]:
    """A zeroed [rows, H, columns, Dh] array holding buffer's first `kept_rows` rows, in the columns that fit."""
    out = np.zeros((rows, buffer.shape[1], columns, buffer.shape[3]), buffer.dtype)
    keep = min(columns, buffer.shape[2])
    out[:kept_rows, :, :keep] = buffer[:kept_rows, :, :keep]
    return out
