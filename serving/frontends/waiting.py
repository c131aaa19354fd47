"""The bounded queue of a batching front model: requests wait here, not in Triton's queue.

Triton 2.51's dynamic batcher, once a model has a queue policy (``default_queue_policy``), can hold a request for
the scheduler's 500 ms idle wait when it arrives while every instance is busy (docs/reliability.md; measured by
``python -m benchmarks.queue_policy``). So the front models carry no Triton queue policy: ``execute()`` only
validates the requests, puts them here and returns, which keeps Triton's own queue empty, and the front model's
worker thread takes what waits, a batch at a time, as the dynamic batcher would have handed it over. The bound
is kept here instead: a request that finds the queue full is refused at once, and one that waited longer than
the timeout is refused when its turn comes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tasks.definition import QUEUE_SIZE_PARAMETER, QUEUE_TIMEOUT_PARAMETER


@dataclass
class Waiting:
    """A valid request waiting for the worker: where its answer goes, its texts and the settings it shares with
    the requests it may be batched with."""

    sender: Any  # the request's response sender
    texts: list[str]
    options: tuple
    arrived: float = field(default_factory=time.monotonic)


class RequestQueue:
    """At most ``max_size`` waiting requests, each for at most ``timeout_s`` seconds.

    ``put`` never blocks (it returns what found the queue full); ``take`` blocks until something waits and returns
    the oldest requests, up to ``max_rows`` texts, split into those still in time and those that waited too long. After
    ``close`` nothing more is accepted, and ``take`` hands out what is left, then None.
    """

    def __init__(self, max_size: int, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if max_size < 1 or timeout_s <= 0:
            raise ValueError(f"a queue needs max_size >= 1 and timeout_s > 0, got {max_size} and {timeout_s}")
        self.max_size = max_size
        self.timeout_s = timeout_s
        self.clock = clock
        self._items: deque[Waiting] = deque()
        self._changed = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    def put(self, items: list[Waiting]) -> list[Waiting]:
        """Queue the items, in order, while there is room (together: the worker can take them as one batch);
        returns those that found the queue full (all of them once it is closed)."""
        with self._changed:
            room = 0 if self._closed else max(0, self.max_size - len(self._items))
            self._items.extend(items[:room])
            if items[:room]:
                self._changed.notify()
            return items[room:]

    def take(self, max_rows: int) -> tuple[list[Waiting], list[Waiting]] | None:
        with self._changed:
            while not self._items and not self._closed:
                self._changed.wait()
            if not self._items:
                return None
            now = self.clock()
            fresh: list[Waiting] = []
            expired: list[Waiting] = []
            rows = 0
            while self._items:
                item = self._items[0]
                if now - item.arrived > self.timeout_s:
                    expired.append(self._items.popleft())
                    continue
                if fresh and rows + len(item.texts) > max_rows:
                    break
                fresh.append(self._items.popleft())
                rows += len(item.texts)
            return fresh, expired

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()


def queue_bound(parameters: dict[str, str], instances: int, required: bool = True) -> tuple[int, float] | None:
    """This instance's share of the model's queue (the config's parameters, written from the task definition's
    ``queue``): (max waiting requests, timeout in seconds); None when the config gives none and none is
    ``required``."""
    missing = [name for name in (QUEUE_SIZE_PARAMETER, QUEUE_TIMEOUT_PARAMETER) if name not in parameters]
    if len(missing) == 2 and not required:
        return None
    if missing:
        raise ValueError(
            f"the model config lacks the parameter(s) {', '.join(missing)}: a batching front model bounds its "
            "queue (give the endpoint a `queue` table in its task definition)"
        )
    size = int(parameters[QUEUE_SIZE_PARAMETER])
    return max(1, -(-size // max(1, instances))), float(parameters[QUEUE_TIMEOUT_PARAMETER])
