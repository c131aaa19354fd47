"""serving.launcher.stop_signals: a Ctrl-C or SIGTERM that lands while the launcher forks Triton or the gateway is
raised once the child is known, never lost and never leaving a child nobody stops.

The forks are made to receive the signal at the worst moment, from inside ``subprocess.Popen``, so these tests
fail whenever a start stops holding the stop signals."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from serving.launcher import stop_signals
from serving.launcher.embedded import EmbeddedTriton, ServerOptions, free_ports
from serving.launcher.gateway import Gateway, GatewayOptions

ROOT = Path(__file__).resolve().parents[1]
REAL_POPEN = subprocess.Popen


@pytest.fixture
def installed():
    """The launcher's handlers, put back as they were afterwards."""
    before = {number: signal.getsignal(number) for number in stop_signals.STOP_SIGNALS}
    stop_signals.install()
    yield
    for number, handler in before.items():
        signal.signal(number, handler)


@pytest.mark.parametrize("number", stop_signals.STOP_SIGNALS)
def test_each_stop_signal_raises_keyboard_interrupt(installed, number):
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), number)
        for _ in range(1000):  # the handler runs at one of these bytecodes
            pass


def test_a_signal_inside_held_is_raised_as_the_block_ends(installed):
    finished = False
    with pytest.raises(KeyboardInterrupt):
        with stop_signals.held():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
            finished = True
    assert finished
    with stop_signals.held():  # raised once, not again
        pass


def interrupted_popen(command: list[str], **kwargs):
    """A `sleep` started as the child would be, with a SIGINT to this process right before the fork."""
    os.kill(os.getpid(), signal.SIGINT)
    return REAL_POPEN(["sleep", "60"], **kwargs)


def test_the_gateway_start_raises_the_stop_only_once_its_process_is_known(installed, monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", interrupted_popen)
    gateway = Gateway(GatewayOptions(port=free_ports(1)[0]))
    with pytest.raises(KeyboardInterrupt):
        gateway.start()
    assert gateway.is_alive
    assert gateway.stop(5) == -signal.SIGTERM


def test_the_triton_start_raises_the_stop_only_once_its_process_is_known(installed, monkeypatch):
    def popen(command: list[str], **kwargs):  # the server, not its reaper
        is_server = "tritonserver" in str(command[0])
        return interrupted_popen(command, **kwargs) if is_server else REAL_POPEN(command, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    http, grpc, metrics = free_ports(3)
    options = ServerOptions(
        model_repository=ROOT / "model_repository", models=["sentiment"], http_port=http, grpc_port=grpc
    )
    options.metrics_port = metrics
    server = EmbeddedTriton(options)
    with pytest.raises(KeyboardInterrupt):
        server.start()
    assert server.kill() == -signal.SIGKILL  # it knew its child
