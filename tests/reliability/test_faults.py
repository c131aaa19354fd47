"""Faults: a killed stub, SIGTERM under load, a broken model file, a restart under load.

Each test runs a server of its own and prints what it measured (run with -s); docs/reliability.md's table holds
those numbers.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from reliability_helpers import connect, copy_models, infer, outcome, stub_pids, text_input
from tritonclient.utils import InferenceServerException

from clients import Client, RetryPolicy
from serving.launcher.embedded import EmbeddedTriton, free_ports
from serving.launcher.processes import process_group_members
from serving.launcher.reaper import SHM_ROOT
from serving.launcher.watchdog import command_line

pytestmark = pytest.mark.server  # every test here starts a server of its own

ROOT = Path(__file__).resolve().parents[2]
SENTIMENT = ["sentiment", "sentiment_encoder"]
TRANSLATE = ["translate", "translate_generator"]


class Load:
    """`threads` clients sending `model` requests back to back until stopped; every outcome with its time."""

    def __init__(
        self, server: EmbeddedTriton, model: str, text: str, threads: int = 4, timeout_s: float = 30.0
    ) -> None:
        self.server, self.model, self.text, self.timeout_s = server, model, text, timeout_s
        self.outcomes: list[tuple[float, str, float]] = []  # (sent at, "ok" or error, latency)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)
        assert not any(thread.is_alive() for thread in self._threads), "a client hung"

    def _run(self) -> None:
        with connect(self.server, "grpc") as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                result = outcome(client, self.model, [text_input(grpcclient, [self.text])], self.timeout_s)
                self.outcomes.append((sent, result, time.monotonic() - sent))

    def after(self, moment: float) -> list[tuple[float, str, float]]:
        return [o for o in self.outcomes if o[0] >= moment]


# Triton 2.51's Python backend can abort the whole server right after a stub is killed under load
# (`boost::interprocess::lock_exception` in libtriton_python.so, docs/reliability.md). The launcher starts such a
# server again (`--max-restarts`, tests/reliability/test_launcher.py); these tests are about the stub watchdog, so
# after that abort they run their kill once more on a fresh server, and say so.
KNOWN_ABORT = ("lock_exception", "libtriton_python.so")


@dataclass
class Kill:
    """One stub killed under load: the server, the victim, the load's outcomes, and when it was killed and reloaded."""

    server: EmbeddedTriton
    victim: int
    load: Load
    killed_at: float
    reloaded_at: float


def kill_stub_under_load(
    start_server, models: list[str], load: Callable[[EmbeddedTriton], Load], settle_s: float
) -> Kill:
    """Start ``models``, SIGKILL the stub of ``models[0]`` under ``load``, wait for the watchdog's reload (at most
    30 s), then ``settle_s`` more; once more on a fresh server if Triton aborted in Triton's known way."""
    for attempt in (1, 2):
        server = start_server(models)
        victim = next(pid for pid, model in stub_pids(server).items() if model == models[0])
        with load(server) as running:
            time.sleep(2.0)
            killed_at = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            while (
                server.is_alive and server.watchdog.reloads.get(models[0], 0) < 1 and time.monotonic() < killed_at + 30
            ):
                time.sleep(0.1)
            reloaded_at = time.monotonic()
            time.sleep(settle_s)
        tail = server.log_tail(200)
        if server.is_alive or attempt == 2 or not any(sign in tail for sign in KNOWN_ABORT):
            return Kill(server, victim, running, killed_at, reloaded_at)
        print(f"\ntritonserver aborted after the kill (Triton's known crash), once more on a fresh server:\n{tail}")
    raise AssertionError("unreachable")


def test_killed_front_model_stub_is_replaced_and_clients_see_errors_not_hangs(start_server) -> None:
    kill = kill_stub_under_load(start_server, SENTIMENT, lambda server: Load(server, "sentiment", "这部电影不差"), 2.0)
    server, load = kill.server, kill.load
    failures = [o for o in load.outcomes if o[1] != "ok"]
    last_failure = max((o[0] + o[2] for o in failures), default=kill.killed_at)
    print(
        f"\nstub {kill.victim} killed: {len(failures)} failed requests of {len(load.outcomes)}, "
        f"{Counter(o[1] for o in failures)}; watchdog reload after {kill.reloaded_at - kill.killed_at:.2f} s; "
        f"last failure {last_failure - kill.killed_at:.2f} s after the kill; max latency "
        f"{max(o[2] for o in load.outcomes):.2f} s"
    )
    assert server.is_alive, f"tritonserver exited with {server.returncode}:\n{server.log_tail(80)}"
    assert server.watchdog.reloads == {"sentiment": 1}, (
        f"watchdog: {server.watchdog.problem()}; server log:\n{server.log_tail(60)}"
    )
    assert kill.victim not in stub_pids(server)
    # The failures in between are errors the client saw, each within about one health-check period.
    assert all("is not healthy" in o[1] and o[2] < 10 for o in failures)
    # Later requests succeed: everything sent a second after the reload was answered.
    late = load.after(kill.reloaded_at + 1.0)
    assert late and all(o[1] == "ok" for o in late)


ENGINE_DEADLINE_S = 8.0


def test_killed_engine_stub_leaves_what_it_held_to_the_client_deadline(start_server) -> None:
    """The known limit of the fronts that hand requests over (docs/reliability.md): a request `translate`'s engine
    held when its stub was killed is answered by nobody; the client's deadline ends it. Everything else behaves
    as for the sentiment front: an error within a health check, a reload, then answers."""
    text = "他每天早上六点起床，然后去公园跑步，跑完步以后回家吃早饭。"
    kill = kill_stub_under_load(
        start_server,
        TRANSLATE,
        lambda server: Load(server, "translate", text, threads=6, timeout_s=ENGINE_DEADLINE_S),
        ENGINE_DEADLINE_S + 1.0,
    )
    server, load = kill.server, kill.load
    failures = [o for o in load.outcomes if o[1] != "ok"]
    unhealthy = [o for o in failures if "is not healthy" in o[1]]
    orphaned = [o for o in failures if "DEADLINE_EXCEEDED" in o[1]]
    print(
        f"\nengine stub {kill.victim} killed: {len(failures)} failed of {len(load.outcomes)} "
        f"({len(unhealthy)} 'not healthy', {len(orphaned)} at the {ENGINE_DEADLINE_S:g} s client deadline); "
        f"reload after {kill.reloaded_at - kill.killed_at:.2f} s"
    )
    assert server.is_alive and server.watchdog.reloads == {"translate": 1}, server.log_tail(60)
    assert len(unhealthy) + len(orphaned) == len(failures), Counter(o[1] for o in failures)
    assert all(o[2] < 10 for o in unhealthy)
    # What the killed engine held (at most one request per client thread) ended at the deadline, not later.
    assert len(orphaned) <= 6 and all(o[2] < ENGINE_DEADLINE_S + 2 for o in orphaned)
    late = load.after(kill.reloaded_at + 1.0)
    assert late and all(o[1] == "ok" for o in late)


def test_sigterm_under_load_drains_in_flight_and_refuses_new(start_server) -> None:
    server = start_server(TRANSLATE, exit_timeout_s=60)
    long_text = "他每天早上六点起床，然后去公园跑步，跑完步以后回家吃早饭，再坐地铁去公司上班。" * 2
    results: list[str] = []

    def slow_request() -> None:
        with connect(server, "grpc") as client:
            results.append(outcome(client, "translate", [text_input(grpcclient, [long_text] * 16)], timeout_s=60))

    threads = [threading.Thread(target=slow_request) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # in flight: 64 long texts with 4 beams take seconds on 2 cores
    signalled = time.monotonic()
    stopper = threading.Thread(target=server.stop)  # what SIGTERM/Ctrl-C to `python -m serving` runs
    stopper.start()
    time.sleep(0.3)
    with connect(server, "grpc") as client:
        refused = outcome(client, "translate", [text_input(grpcclient, ["我爱你。"])], timeout_s=10)
    for thread in threads:
        thread.join(timeout=60)
    returncode = server.process.wait(timeout=server.options.exit_timeout_s + 10)
    exited_after = time.monotonic() - signalled
    stopper.join(timeout=30)
    print(f"\nstop under load: in-flight {results}; new: {refused}; exit {returncode} after {exited_after:.1f} s")
    assert results == ["ok"] * 4  # in-flight requests completed
    # a new one was refused by the drain (the front model is gone), not queued, nor failed by a dying server
    assert "NOT_FOUND" in refused and "translate" in refused, refused
    assert returncode == 0 and exited_after < server.options.exit_timeout_s
    assert process_group_members(server.pid) == []
    assert list(SHM_ROOT.glob(f"{server.shm_prefix}*")) == []


def broken_repository(tmp_path: Path) -> Path:
    """The sentiment endpoint's in-process encoder graph replaced by bytes that are not ONNX."""
    repo = copy_models(tmp_path / "repo", SENTIMENT + TRANSLATE)
    broken = repo / "sentiment" / "1" / "encoder.onnx"
    broken.unlink()
    broken.write_bytes(b"\x08\x07 this is not an ONNX model")
    return repo


def test_broken_model_file_leaves_the_other_endpoints_serving(start_server, tmp_path: Path) -> None:
    server = start_server(SENTIMENT + TRANSLATE, repository=broken_repository(tmp_path), require_all_models=False)
    failed = server.unavailable_models()
    print(f"\nbroken model: {failed}")
    assert set(failed) == {"sentiment"}
    assert "encoder.onnx" in failed["sentiment"]
    with connect(server, "http") as client:
        assert client.is_server_live() and not client.is_server_ready()  # readiness reports the broken one
        assert not client.is_model_ready("sentiment") and client.is_model_ready("translate")
        assert client.is_model_ready("sentiment_encoder")  # the BLS model beside it is fine
    with connect(server, "grpc") as client:
        assert (
            "love"
            in infer(client, "translate", [text_input(grpcclient, ["我爱你。"])])
            .as_numpy("TRANSLATION")[0, 0]
            .decode()
            .lower()
        )
        with pytest.raises(InferenceServerException, match="sentiment"):
            infer(client, "sentiment", [text_input(grpcclient, ["很好"])])
    log = server.log_tail(400)
    assert "sentiment" in log and "encoder.onnx" in log


class ServingCli:
    """`python -m serving` in a subprocess (what `make serve` runs), its output in files; SIGINT stops it."""

    def __init__(self, tmp_path: Path, repository: Path) -> None:
        self.ports = free_ports(3)
        self.out, self.err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        command = [sys.executable, "-m", "serving", "--model-repository", str(repository)]
        for name, port in zip(("http", "grpc", "metrics"), self.ports):
            command += [f"--{name}-port", str(port)]
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=err, text=True)

    def wait_ready(self, times: int = 1, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while self.out.read_text().count("Triton ready") < times:
            assert self.process.poll() is None and time.monotonic() < deadline, self.err.read_text()
            time.sleep(0.2)

    def stop(self) -> str:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=60)
        return self.err.read_text()


def test_serving_cli_starts_degraded_and_names_the_broken_model(tmp_path: Path) -> None:
    cli = ServingCli(tmp_path, broken_repository(tmp_path))
    try:
        cli.wait_ready()
    finally:
        stderr = cli.stop()
    assert cli.process.returncode == 0, stderr
    assert "serving WITHOUT these models" in stderr and "sentiment:" in stderr and "encoder.onnx" in stderr


def test_serving_cli_restarts_a_crashed_server(tmp_path: Path) -> None:
    cli = ServingCli(tmp_path, copy_models(tmp_path / "repo", SENTIMENT))
    try:
        cli.wait_ready()
        grpc_flag = f"--grpc-port={cli.ports[1]}"
        (server_pid,) = [
            int(pid)
            for pid in os.listdir("/proc")
            if pid.isdigit() and grpc_flag in (argv := command_line(int(pid))) and argv[0].endswith("tritonserver")
        ]
        os.kill(server_pid, signal.SIGKILL)  # what a crash looks like from outside
        killed_at = time.monotonic()
        cli.wait_ready(times=2)
        print(f"\nserver killed under the CLI: serving again after {time.monotonic() - killed_at:.1f} s")
        with grpcclient.InferenceServerClient(f"127.0.0.1:{cli.ports[1]}") as client:
            result = client.infer("sentiment", [text_input(grpcclient, ["这部电影不差"])], client_timeout=30)
            assert result.as_numpy("LABEL")[0, 0] == b"positive"
    finally:
        stderr = cli.stop()
    assert "tritonserver exited on its own with code -9; restarting it (1/5)" in stderr
    assert cli.process.returncode == 0


def test_restart_under_load_clients_retry_then_succeed(start_server, caplog) -> None:
    server = start_server(SENTIMENT)
    options = server.options
    policy = RetryPolicy(max_attempts=60, base_delay_s=0.1, max_delay_s=0.5)
    answers: list = []
    errors: list = []
    stop = threading.Event()

    def client_loop() -> None:
        with Client(server.grpc_url, retry=policy, timeout_s=10) as client:
            while not stop.is_set():
                try:
                    answers.append(client.sentiment(["这部电影不差"])[0].label)
                except Exception as err:  # noqa: BLE001 - any error fails the test below
                    errors.append(err)

    caplog.set_level(logging.INFO, logger="ropeserve.client")
    worker = threading.Thread(target=client_loop)
    worker.start()
    time.sleep(1.0)
    before_restart = len(answers)
    restarted_at = time.monotonic()
    server.stop()
    replacement = EmbeddedTriton(options)
    replacement.start()
    back_after = time.monotonic() - restarted_at
    time.sleep(1.0)
    stop.set()
    worker.join(timeout=60)
    replacement.stop()
    retries = [r for r in caplog.records if r.name == "ropeserve.client" and "retrying" in r.getMessage()]
    print(f"\nrestart: server back after {back_after:.1f} s; {len(retries)} retries; errors {errors}")
    assert errors == []
    assert len(retries) > 0  # the SDK saw the outage and retried
    assert len(answers) > before_restart and set(answers) == {"positive"}  # then succeeded
