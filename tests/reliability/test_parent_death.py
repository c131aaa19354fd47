"""Whatever kills the process that started tritonserver, the server, its stubs, its /dev/shm segments and its work
folder are gone within the exit timeout (serving/launcher/reaper.py; the parent-death signal alone left the work folder
behind, and no signal at all reaches a server started from a worker thread)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reliability_helpers import REPOSITORY

from serving.launcher.processes import process_group_members
from serving.launcher.reaper import SHM_ROOT

ROOT = Path(__file__).resolve().parents[2]
EXIT_TIMEOUT_S = 10
# A process that starts a server (from a worker thread when asked: no parent-death signal then), says where its
# traces are, and waits to be killed.
PARENT = """
import json, sys, threading, time
from serving.launcher.embedded import EmbeddedTriton, ServerOptions, free_ports
http, grpc, metrics = free_ports(3)
options = ServerOptions(model_repository=sys.argv[1], models=["sentiment", "sentiment_encoder"], http_port=http,
                        grpc_port=grpc, metrics_port=metrics, exit_timeout_s=int(sys.argv[2]))
server = EmbeddedTriton(options)
starter = threading.Thread(target=server.start) if sys.argv[3] == "thread" else None
starter.start() if starter else server.start()
starter.join() if starter else None
print(json.dumps({"pid": server.pid, "shm": server.shm_prefix, "workdir": str(server._running.workdir)}), flush=True)
time.sleep(600)
"""


def traces(started: dict) -> dict[str, object]:
    return {
        "processes": process_group_members(started["pid"]),
        "shm": sorted(p.name for p in SHM_ROOT.glob(f"{started['shm']}*")),
        "workdir": Path(started["workdir"]).exists(),
    }


@pytest.mark.server
@pytest.mark.parametrize(("kill", "started_from"), [("SIGKILL", "main"), ("SIGTERM", "main"), ("SIGKILL", "thread")])
def test_a_killed_parent_leaves_no_server_stub_or_segment(kill, started_from):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(REPOSITORY), str(EXIT_TIMEOUT_S), started_from],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        started = json.loads(parent.stdout.readline())
    except ValueError:
        parent.kill()
        pytest.fail("the parent did not start its server")
    before = traces(started)
    assert len(before["processes"]) >= 3 and before["shm"] and before["workdir"], before  # server + 2 stubs

    parent.send_signal(getattr(signal, kill))
    parent.wait(timeout=10)
    deadline = time.monotonic() + EXIT_TIMEOUT_S + 5
    while (left := traces(started)) != {"processes": [], "shm": [], "workdir": False}:
        if time.monotonic() > deadline:
            for pid in left["processes"]:
                os.kill(pid, signal.SIGKILL)
            pytest.fail(f"{kill} to the parent left {left} after {EXIT_TIMEOUT_S + 5} s")
        time.sleep(0.2)
