"""Ctrl-C and SIGTERM for a process that starts children: :func:`install` makes both raise
:class:`KeyboardInterrupt` in the main thread, and :func:`held` keeps them out of a block that forks.

Why hold them: Python runs a signal's handler in the main thread at its next bytecode, wherever that is. Inside
``subprocess.Popen`` that can be an at-fork hook (``logging`` registers one), whose exception Python prints and
drops, losing the stop; or it can be after the fork and before ``Popen`` returns, leaving a child that its caller
never learns of. A held signal is raised when the block ends.

Without :func:`install` (a program using :class:`~serving.launcher.embedded.EmbeddedTriton` on its own),
``held`` changes nothing.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_depth = 0  # nested held() blocks; only the main thread, where handlers run, reads and writes these
_pending = False


def _stop(signum: int, frame: FrameType | None) -> None:
    global _pending
    if _depth:
        _pending = True
        return
    raise KeyboardInterrupt


def install() -> None:
    """SIGTERM takes Ctrl-C's path; and a shell that started us in the background (SIGINT ignored) cannot stop
    Ctrl-C or ``kill -INT`` from stopping us."""
    for number in STOP_SIGNALS:
        signal.signal(number, _stop)


@contextmanager
def held() -> Iterator[None]:
    """Run the block whole; a stop signal that arrived meanwhile is raised as it ends."""
    global _depth, _pending
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
    if _pending and not _depth:
        _pending = False
        raise KeyboardInterrupt
