"""Start and stop the gateway (:mod:`serving.gateway`) as a process beside Triton: the one way ``make serve``,
the containers, the tests and the benchmarks run it.

A process of its own, not a thread of the launcher: its event loop then never waits on the launcher, and a
crash of one leaves the other serving. It dies with the launcher (Linux's parent-death signal).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from . import stop_signals

PR_SET_PDEATHSIG = 1


@dataclass
class GatewayOptions:
    triton_grpc: str = "127.0.0.1:8001"
    host: str = "127.0.0.1"
    port: int = 5000
    keys_file: Path | None = None
    usage_file: Path | None = None
    open_without_keys: bool = False
    translator: str = ""  # the task behind DeepL's and LibreTranslate's APIs ("": the gateway's default)
    ready_timeout_s: float = 30.0
    env: dict[str, str] = field(default_factory=dict)

    def command(self) -> list[str]:
        command = [
            sys.executable,
            "-m",
            "serving.gateway",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--triton",
            self.triton_grpc,
        ]
        if self.keys_file is not None:
            command += ["--keys", str(self.keys_file)]
        if self.usage_file is not None:
            command += ["--usage-file", str(self.usage_file)]
        if self.open_without_keys:
            command.append("--open-without-keys")
        if self.translator:
            command += ["--translator", self.translator]
        return command


class GatewayError(RuntimeError):
    """The gateway did not start."""


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the launcher dies."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Gateway:
    """``with Gateway(GatewayOptions(...)) as gateway: gateway.url`` — started, ready, stopped."""

    def __init__(self, options: GatewayOptions) -> None:
        self.options = options
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.options.host in ("0.0.0.0", "::") else self.options.host
        return f"http://{host}:{self.options.port}"

    def start(self) -> None:
        env = {**os.environ, **self.options.env}
        with stop_signals.held():  # a stop landing mid-fork would leave a gateway that stop() does not know
            self.process = subprocess.Popen(self.options.command(), env=env, preexec_fn=_die_with_parent)  # noqa: PLW1509
        deadline = time.monotonic() + self.options.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise GatewayError(f"the gateway exited with code {self.process.returncode} (its log is above)")
            try:
                with urllib.request.urlopen(f"{self.url}/openapi.json", timeout=2):  # noqa: S310 - our own address
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        self.stop()
        raise GatewayError(f"the gateway did not answer on {self.url} within {self.options.ready_timeout_s:g} s")

    @property
    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 35.0) -> int | None:
        """SIGTERM (uvicorn finishes the requests it holds), SIGKILL after `timeout_s`."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> Gateway:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
