"""`python -m serving`, what `make serve` and the containers run: its exit codes, the crash-loop limit, SIGTERM and
the second Ctrl-C, each against a real launcher process and its real tritonserver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from reliability_helpers import REPOSITORY

from serving.launcher.embedded import free_ports
from serving.launcher.processes import process_group_members

ROOT = Path(__file__).resolve().parents[2]
READY = "ropeserve: Triton ready"

pytestmark = pytest.mark.server


class Launcher:
    """`python -m serving` serving `sentiment`, its output (the launcher's and the server's log) read as it comes."""

    def __init__(self, *args: str) -> None:
        http, grpc, metrics, self.gateway_port = free_ports(4)
        command = [sys.executable, "-m", "serving", "--model-repository", str(REPOSITORY)]
        command += ["--models", "sentiment,sentiment_encoder", "--http-port", str(http), "--grpc-port", str(grpc)]
        command += ["--metrics-port", str(metrics), "--gateway-port", str(self.gateway_port), "--exit-timeout", "10"]
        command += args
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.servers: list[int] = []  # every tritonserver it started, for the final check
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()

    def output(self) -> str:
        with self.changed:
            return "".join(self.lines[-60:])

    def wait_for(self, text: str, count: int = 1, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while sum(text in line for line in self.lines) < count:
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no {text!r} (x{count}) within {timeout_s:g} s:\n{''.join(self.lines[-60:])}"
                self.changed.wait(remaining)

    def gateway_pid(self) -> int:
        """The launcher's live gateway child."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if b"serving.gateway" in cmdline and ppid == self.process.pid:
                return int(entry)
        raise AssertionError(f"the launcher has no gateway child:\n{self.output()}")

    def sentiment_over_gateway(self) -> str:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.gateway_port}/v1/sentiment",
            data=json.dumps({"texts": ["这部电影不差"]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)["results"][0]["label"]

    def server_pid(self) -> int:
        """The launcher's live tritonserver child."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                comm = Path(f"/proc/{entry}/comm").read_text().strip()
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if comm == "tritonserver" and ppid == self.process.pid:
                self.servers.append(int(entry))
                return int(entry)
        raise AssertionError(f"the launcher has no tritonserver child:\n{self.output()}")

    def exit_code(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"the launcher was still running after {timeout_s:g} s:\n{self.output()}") from None

    def nothing_left(self) -> bool:
        return all(process_group_members(pid) == [] for pid in self.servers)


def test_a_repository_it_cannot_serve_exits_2():
    launcher = Launcher("--model-repository", "/nonexistent/model_repository")
    assert launcher.exit_code(60) == 2
    assert "cannot serve the model repository" in launcher.output()


def test_a_crashing_server_is_restarted_up_to_the_limit_then_the_launcher_exits_1():
    launcher = Launcher("--max-restarts", "1")
    launcher.wait_for(READY)
    os.kill(launcher.server_pid(), signal.SIGKILL)
    launcher.wait_for("restarting it (1/1)")
    launcher.wait_for(READY, count=2)
    os.kill(launcher.server_pid(), signal.SIGKILL)
    assert launcher.exit_code(60) == 1
    assert "not restarting (1 restarts in the last 10 minutes, --max-restarts 1)" in launcher.output()
    assert launcher.nothing_left()


def test_sigterm_drains_and_exits_0():
    launcher = Launcher()
    launcher.wait_for(READY)
    launcher.server_pid()
    gateway = launcher.gateway_pid()
    launcher.process.send_signal(signal.SIGTERM)
    assert launcher.exit_code(30) == 0
    assert "stopped (tritonserver exit code 0)" in launcher.output()
    assert launcher.nothing_left()
    assert not Path(f"/proc/{gateway}").exists() or "Z" in Path(f"/proc/{gateway}/stat").read_text().split()[2]


def test_the_gateway_beside_triton_answers_and_is_restarted_when_it_dies():
    launcher = Launcher()
    launcher.wait_for("ropeserve: gateway ready")
    assert launcher.sentiment_over_gateway() == "positive"
    os.kill(launcher.gateway_pid(), signal.SIGKILL)
    launcher.wait_for("the gateway exited on its own", timeout_s=10)
    launcher.wait_for("ropeserve: gateway ready", count=2, timeout_s=30)
    assert launcher.sentiment_over_gateway() == "positive"
    launcher.process.send_signal(signal.SIGTERM)
    assert launcher.exit_code(30) == 0


def test_a_second_ctrl_c_kills_at_once():
    launcher = Launcher()
    launcher.wait_for(READY)
    launcher.server_pid()
    launcher.process.send_signal(signal.SIGINT)
    launcher.wait_for("stopping (draining up to 10 s")
    interrupted = time.monotonic()
    launcher.process.send_signal(signal.SIGINT)
    assert launcher.exit_code(30) == 0
    assert "killed" in launcher.output()
    # killed rather than drained: well before a graceful stop of this server would have ended (about 5 s)
    assert time.monotonic() - interrupted < 3, launcher.output()
    assert launcher.nothing_left()
