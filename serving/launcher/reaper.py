"""The server's reaper: when the process that started tritonserver dies without stopping it, stop it.

`EmbeddedTriton` stops its server on `stop()`, at interpreter exit and on Ctrl-C; a parent killed by SIGKILL, or by
a SIGTERM it does not handle, runs none of that. Linux's parent-death signal covers only part of it (it follows the
*thread* that started the server, and Triton then takes up to its exit timeout), and nobody removes the shared
memory segments and the work folder. So `EmbeddedTriton.start` also starts this small process, in a session of its
own, which polls every 0.2 s: once its parent is gone it sends SIGTERM to the server's process group, SIGKILLs
what is left after the grace period, removes the server's ``/dev/shm`` segments and its work folder, and exits.
It exits at once, without touching anything, when the server's group is gone (a normal stop).

    python -m serving.launcher.reaper PARENT_PID SERVER_PGID SHM_PREFIX WORKDIR GRACE_S

Standard library only, and nothing from the rest of ``serving``: it must start fast and never fail to import.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

POLL_S = 0.2
SHM_ROOT = Path("/dev/shm")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def parent_gone(parent: int) -> bool:
    if os.getppid() != parent:  # reparented: the parent died
        return True
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        return True
    return False


def reap(pgid: int, shm_prefix: str, workdir: Path, grace_s: float) -> None:
    """SIGTERM the group, SIGKILL it after ``grace_s``, then remove what the server left on disk."""
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 5
            while group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
    remove_shm(shm_prefix)
    shutil.rmtree(workdir, ignore_errors=True)


def remove_shm(prefix: str) -> None:
    """Remove the Python backend's shared-memory segments named with ``prefix`` (the server's own)."""
    for segment in SHM_ROOT.glob(f"{prefix}*"):
        try:
            segment.unlink()
        except FileNotFoundError:
            pass


def main(argv: list[str]) -> int:
    parent, pgid, shm_prefix, workdir, grace_s = int(argv[0]), int(argv[1]), argv[2], Path(argv[3]), float(argv[4])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the parent is the parent's to handle
    while group_alive(pgid):
        if parent_gone(parent):
            reap(pgid, shm_prefix, workdir, grace_s)
            return 0
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
