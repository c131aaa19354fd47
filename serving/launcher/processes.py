"""The server's processes as /proc shows them: the members of its process group and their resident memory."""

from __future__ import annotations

import os


def process_group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``, from /proc. The server's pgid is its pid."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] != b"Z":  # empty: it just exited
            members.append(int(entry))
    return members


def rss_mb(pid: int) -> float:
    """Resident memory of one process, MB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0) / 1024
    except OSError:
        return 0.0


def group_rss_mb(pgid: int) -> float:
    """Resident memory of process group ``pgid`` (the server and its Python stubs), MB."""
    return sum(rss_mb(pid) for pid in process_group_members(pgid))
