"""Start, watch and stop the embedded Triton server: the one way the CLI, tests and benchmarks run it.

``tritonserver`` comes from the ``nvidia-pytriton`` wheel (:mod:`serving.launcher.wheel`); ONNX models run in our
Python-based onnxruntime backend (:mod:`serving.launcher.backend_dir`). The launcher's promises:

- a port that is already taken, a missing ``model.onnx`` or a model that fails to load is reported as one
  clear error (with the tail of the server log), not a hang;
- :meth:`EmbeddedTriton.stop` leaves nothing behind: the server runs in its own process group with its
  Python-backend stubs, stragglers get SIGKILL, and the ``/dev/shm`` segments named with this server's
  unique prefix are removed. The same clean-up runs when the object is garbage-collected or at exit, and
  :mod:`.reaper` runs it when this process dies without stopping the server (SIGKILL, an unhandled SIGTERM).

Usage::

    with EmbeddedTriton(ServerOptions(model_repository=Path("model_repository"))) as server:
        client = tritonclient.grpc.InferenceServerClient(server.grpc_url)
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import functools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from . import secret_args, stop_signals
from .backend_dir import build_backend_directory
from .control import http_status, repository_index
from .drain import drain_front_models
from .http_guard import DEFAULT_MAX_BODY_BYTES, HttpGuard
from .processes import process_group_members
from .reaper import remove_shm
from .repository import require_servable
from .watchdog import StubWatchdog
from .wheel import TritonWheel, warn_if_numpy_2

CONTROL_KEY_HEADER = "ropeserve-control-key"
# Triton 2.51 checks restricted gRPC protocols against this prefixed metadata key (the HTTP header has none).
GRPC_CONTROL_KEY_HEADER = f"triton-grpc-protocol-{CONTROL_KEY_HEADER}"


class ServerError(RuntimeError):
    """The embedded server could not be started or did not become ready."""


class PortInUseError(ServerError):
    """One of the server's ports is taken; the message names it."""


@dataclass
class ServerOptions:
    """How to run ``tritonserver``. Defaults bind loopback on Triton's usual ports.

    ``models``: ``None`` loads every model in the repository; a list loads just those. The server always runs in
    model-control mode ``explicit`` with the load/unload API locked by a key that only this process knows, so
    nobody can load or unload models over the network. ``allow_model_control`` hands that key out: it is
    ``control_key`` (see :meth:`EmbeddedTriton.control_headers`).

    ``restart_dead_stubs``: reload a model whose Python-backend stub process died (:mod:`serving.launcher.watchdog`);
    Triton 2.51 would otherwise keep failing the requests routed to that instance.

    ``http_guard``: serve HTTP through :mod:`.http_guard`, which refuses bodies over ``max_http_body_bytes``
    (413) and every other request Triton 2.51 could misread or crash on, and answers ``/v2/health/live`` with 503
    when :meth:`EmbeddedTriton.liveness_problem` names one.

    ``require_all_models``: a model that fails to load makes :meth:`EmbeddedTriton.start` fail. Without it the
    server keeps serving the other models (``--exit-on-error=false``), ``/v2/health/ready`` stays false
    (strict readiness) and :meth:`EmbeddedTriton.unavailable_models` names each failure and its cause.

    ``tritonserver``: run this binary (e.g. the NGC image's ``/opt/tritonserver/bin/tritonserver``) with its
    own ``backends`` directory (``backend_directory``, default ``<binary>/../../backends``: native onnxruntime,
    python) instead of the wheel's binary with the Python-based onnxruntime backend. The safeguards are the same.

    ``model_repository`` may be a URL Triton reads itself (``s3://…``, ``gs://…``, ``as://…``): it is passed on
    as is, without the local pre-start checks.

    ``die_with_parent``: if this process dies without stopping the server (SIGKILL, an unhandled SIGTERM),
    :mod:`serving.launcher.reaper` stops it within ``exit_timeout_s`` and removes its shm segments and work folder. The
    server also gets Linux's parent-death SIGTERM when started from the main thread (the kernel ties that signal
    to the starting *thread*: a server started from a worker thread was told to stop as that thread ended).
    """

    model_repository: Path | str = Path("model_repository")
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    model_config_name: str | None = "cpu"
    models: list[str] | None = None
    allow_model_control: bool = False
    control_key: str | None = None
    restart_dead_stubs: bool = True
    require_all_models: bool = True
    http_guard: bool = True
    max_http_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    exit_timeout_s: int = 30
    ready_timeout_s: float = 120.0
    log_verbose: int = 0
    stream_log: bool = False
    log_file: Path | None = None
    die_with_parent: bool = True
    tritonserver: Path | None = None
    backend_directory: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)

    def ports(self) -> dict[str, int]:
        return {"http": self.http_port, "grpc": self.grpc_port, "metrics": self.metrics_port}

    @property
    def remote_repository(self) -> bool:
        """The repository is a URL (object storage) that Triton reads itself."""
        return "://" in str(self.model_repository)

    def repository_argument(self) -> str:
        return str(self.model_repository) if self.remote_repository else str(Path(self.model_repository).resolve())

    def command_args(
        self,
        backend_dir: Path,
        cache_dir: Path | None,
        shm_prefix: str,
        control_key: str,
        guarded_http_port: int = 0,
    ) -> list[str]:
        """The ``tritonserver`` flags (no binary). Pure, so tests can read what would run.

        ``guarded_http_port``: Triton's HTTP endpoint listens there on loopback, behind :mod:`.http_guard`.
        """
        http_host, http_port = ("127.0.0.1", guarded_http_port) if guarded_http_port else (self.host, self.http_port)
        args = [
            f"--model-repository={self.repository_argument()}",
            f"--backend-directory={backend_dir}",
            *([f"--cache-directory={cache_dir}"] if cache_dir else []),
            f"--http-address={http_host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.host}",
            f"--http-port={http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--metrics-config=summary_latencies=true",
            "--exit-on-error=false",
            "--strict-readiness=true",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            f"--log-verbose={self.log_verbose}",
            f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        ]
        if self.model_config_name:
            args.append(f"--model-config-name={self.model_config_name}")
        args.append("--model-control-mode=explicit")
        args += [f"--load-model={name}" for name in (self.models if self.models is not None else ["*"])]
        args += [
            f"--http-restricted-api=model-repository:{CONTROL_KEY_HEADER}={control_key}",
            f"--grpc-restricted-protocol=model-repository:{CONTROL_KEY_HEADER}={control_key}",
        ]
        return args + list(self.extra_args)


def free_ports(count: int = 3, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that are free right now (held open together so they differ)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]


def port_in_use(host: str, port: int) -> bool:
    """True when ``host:port`` cannot be bound. SO_REUSEADDR, as servers use it: TIME_WAIT is no conflict."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise ServerError(f"cannot bind {host}:{port}: {exc}") from exc
    return False


def _url_host(host: str) -> str:
    """Where a client on this machine reaches a server bound to ``host``."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _set_parent_death_signal() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _start_reaper(server_pid: int, shm_prefix: str, workdir: Path, grace_s: float) -> subprocess.Popen:
    """reaper.py, run as a file (standard library only, no site packages: it starts in milliseconds), in a
    session of its own so that neither a Ctrl-C to this terminal nor a kill of the server's group reaches it."""
    script = Path(__file__).with_name("reaper.py")
    arguments = [str(os.getpid()), str(server_pid), shm_prefix, str(workdir), str(grace_s)]
    return subprocess.Popen(
        [sys.executable, "-I", "-S", str(script), *arguments], stdin=subprocess.DEVNULL, start_new_session=True
    )


def _read_tail(path: Path, max_lines: int, max_bytes: int = 256_000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-max_lines:])


@dataclass
class _Running:
    """What clean-up needs, kept apart from :class:`EmbeddedTriton` so a finalizer can hold it."""

    process: subprocess.Popen
    workdir: Path
    log_path: Path
    log_handle: IO[bytes]
    shm_prefix: str
    exit_timeout_s: int
    tee: threading.Thread | None = None
    watchdog: StubWatchdog | None = None
    guard: HttpGuard | None = None
    drain: Callable[[float], object] | None = None  # unloads the front models first (drain.py)
    reaper: subprocess.Popen | None = None  # stops the server if this process dies without doing it (reaper.py)
    final_log_tail: str = ""
    returncode: int | None = None
    cleaned: bool = False


def _shutdown(running: _Running, graceful: bool = True) -> None:
    """SIGTERM and wait for the drain (if ``graceful``), SIGKILL what is left of the process group, then
    remove the shm segments and the work dir. Idempotent; safe to call again after being interrupted."""
    if running.cleaned:
        return
    if running.watchdog is not None:
        running.watchdog.stop()  # a stopping server's stubs exit: that is no crash to repair
    process = running.process
    if graceful and process.poll() is None:
        if running.drain is not None:
            running.drain(running.exit_timeout_s)
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=running.exit_timeout_s + 5)
    deadline = time.monotonic() + 5
    while members := process_group_members(process.pid):  # stubs outliving the server, or a hung server
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            print(f"ropeserve: processes {members} of the server's group survived SIGKILL", file=sys.stderr)
            break
        time.sleep(0.05)
    running.returncode = process.wait()
    if running.reaper is not None:  # it exits by itself once the group is gone
        try:
            running.reaper.wait(timeout=2)
        except subprocess.TimeoutExpired:
            running.reaper.kill()
            running.reaper.wait()
    if running.guard is not None:
        running.guard.stop()
    if running.tee is not None:
        running.tee.join(timeout=5)
    running.log_handle.close()
    remove_shm(running.shm_prefix)
    running.final_log_tail = _read_tail(running.log_path, 200)
    shutil.rmtree(running.workdir, ignore_errors=True)
    running.cleaned = True


def _tee(source: IO[bytes], sink: IO[bytes]) -> None:
    """Copy the server's output to its log file and to our stdout (``stream_log``)."""
    for line in iter(source.readline, b""):
        sink.write(line)
        sink.flush()
        with contextlib.suppress(ValueError, OSError):
            sys.stdout.write(line.decode("utf-8", errors="replace"))
            sys.stdout.flush()
    source.close()


def _spawn(
    opts: ServerOptions, shm_prefix: str, control_key: str, liveness: Callable[[], str | None], die_with_parent: bool
) -> _Running:
    """Start tritonserver in a work folder of its own, with its HTTP guard, reaper and log tee as the options ask;
    on a failure nothing is left behind."""
    wheel = None if opts.tritonserver else TritonWheel.locate()
    workdir = Path(tempfile.mkdtemp(prefix="ropeserve-triton-"))
    log_handle: IO[bytes] | None = None
    guard = None
    try:
        if wheel is not None:
            binary, cache_dir, environment = wheel.binary, wheel.caches, wheel.environment()
            backend_dir = build_backend_directory(workdir / "backends", wheel)
        else:
            binary, cache_dir, environment = Path(opts.tritonserver), None, dict(os.environ)
            backend_dir = opts.backend_directory or binary.resolve().parents[1] / "backends"
        guarded_port = 0
        if opts.http_guard:
            guarded_port = free_ports(1)[0]
            upstream = ("127.0.0.1", guarded_port)
            guard = HttpGuard(opts.host, opts.http_port, upstream, opts.max_http_body_bytes, liveness=liveness).start()
        log_path = Path(opts.log_file) if opts.log_file else workdir / "tritonserver.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_handle = open(log_path, "wb")  # closed by _shutdown
        command = [
            str(binary),
            *opts.command_args(backend_dir, cache_dir, shm_prefix, control_key, guarded_port),
        ]
        try:  # the control key stays off the command line, which every local user can read
            command, environment = secret_args.hide(command, control_key, {**environment, **opts.env})
        except secret_args.SecretArgumentsUnavailable as err:
            raise ServerError(str(err)) from None
        process = subprocess.Popen(
            command,
            cwd=workdir,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if opts.stream_log else log_handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() can reach the stubs too
            preexec_fn=_set_parent_death_signal if die_with_parent else None,
        )
    except BaseException:
        if guard is not None:
            guard.stop()
        if log_handle is not None:
            log_handle.close()
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    running = _Running(process, workdir, log_path, log_handle, shm_prefix, opts.exit_timeout_s, guard=guard)
    if opts.die_with_parent:
        running.reaper = _start_reaper(process.pid, shm_prefix, workdir, opts.exit_timeout_s)
    if opts.stream_log:
        running.tee = threading.Thread(
            target=_tee, args=(process.stdout, log_handle), name="tritonserver-log", daemon=True
        )
        running.tee.start()
    return running


class EmbeddedTriton:
    """One ``tritonserver`` process. A context manager: ``__enter__`` starts it and waits until ready.

    ``ServerOptions`` fields may also be given as keyword overrides: ``EmbeddedTriton(opts, http_port=9000)``.
    """

    def __init__(self, options: ServerOptions | None = None, **overrides) -> None:
        base = options or ServerOptions()
        self.options = dataclasses.replace(base, **overrides)
        self.control_key = self.options.control_key or secrets.token_urlsafe(24)
        self.shm_prefix = f"ropeserve{os.getpid()}x{secrets.token_hex(4)}_"
        self._running: _Running | None = None

    # ----- addresses ---------------------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        return f"http://{_url_host(self.options.host)}:{self.options.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` as ``tritonclient.grpc`` wants it."""
        return f"{_url_host(self.options.host)}:{self.options.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{_url_host(self.options.host)}:{self.options.metrics_port}/metrics"

    @property
    def http_address(self) -> str:
        """``host:port`` as ``tritonclient.http`` wants it."""
        return self.http_url.removeprefix("http://")

    def control_headers(self, protocol: str = "http") -> dict[str, str]:
        """Headers that unlock the model-repository API (load/unload/index) in explicit mode."""
        header = GRPC_CONTROL_KEY_HEADER if protocol == "grpc" else CONTROL_KEY_HEADER
        return {header: self.control_key}

    # ----- state -------------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._running.process.pid if self._running else None

    @property
    def process(self) -> subprocess.Popen | None:
        """The ``tritonserver`` process (for signals and waits in tests; :meth:`stop` is the way to stop it)."""
        return self._running.process if self._running else None

    @property
    def is_alive(self) -> bool:
        return self._running is not None and self._running.process.poll() is None

    @property
    def returncode(self) -> int | None:
        if self._running is None:
            return None
        return self._running.returncode if self._running.returncode is not None else self._running.process.poll()

    @property
    def watchdog(self) -> StubWatchdog | None:
        """The stub watchdog (``restart_dead_stubs``); its ``reloads`` say which models it brought back."""
        return self._running.watchdog if self._running else None

    @property
    def log_path(self) -> Path | None:
        """The server's stdout+stderr, stubs included. Removed at stop unless ``log_file`` was given."""
        return self._running.log_path if self._running else None

    def log_tail(self, max_lines: int = 60) -> str:
        """The last lines of the server log, also after :meth:`stop`."""
        if self._running is None:
            return ""
        live = _read_tail(self._running.log_path, max_lines)
        return live or "\n".join(self._running.final_log_tail.splitlines()[-max_lines:])

    # ----- lifecycle ---------------------------------------------------------------------------------
    def start(self, wait: bool = True) -> EmbeddedTriton:
        """Spawn the server and, unless ``wait`` is false, wait until it is ready (stopping it on failure)."""
        if self._running is not None:
            raise ServerError("this EmbeddedTriton was already started; create a new one")
        opts = self.options
        ports = opts.ports()
        if len(set(ports.values())) != len(ports):
            raise ServerError(f"the http, grpc and metrics ports must differ, got {ports}")
        for name, port in ports.items():
            if port_in_use(opts.host, port):
                raise PortInUseError(
                    f"{name} port {port} on {opts.host} is already in use (another tritonserver?); "
                    f"choose another with --{name}-port or ROPESERVE_{name.upper()}_PORT"
                )
        if not opts.remote_repository:
            require_servable(Path(opts.model_repository), opts.models, opts.model_config_name)
        warn_if_numpy_2()

        # Held: a stop landing mid-fork would leave a server (and its reaper) that kill() does not know.
        with stop_signals.held():
            running = _spawn(opts, self.shm_prefix, self.control_key, self.liveness_problem, self._die_with_parent())
            self._running = running
            weakref.finalize(self, _shutdown, running)  # at garbage collection or interpreter exit
        if wait:
            try:
                self.wait_ready()
            except BaseException:
                self.kill()  # nothing to drain yet; a graceful stop would only cost seconds
                raise
            running.drain = functools.partial(drain_front_models, self.http_url, self.control_headers("http"))
            if opts.restart_dead_stubs:
                running.watchdog = StubWatchdog(
                    lambda: process_group_members(running.process.pid), self.http_url, self.control_headers("http")
                )
                running.watchdog.start()
        return self

    def _die_with_parent(self) -> bool:
        return self.options.die_with_parent and threading.current_thread() is threading.main_thread()

    def wait_ready(self, timeout_s: float | None = None) -> EmbeddedTriton:
        """Poll ``/v2/health/ready`` until 200. Raise :class:`ServerError` with the log tail otherwise.

        Triton opens its HTTP port only after the startup model loads have finished, so an HTTP answer
        other than 200 means some model failed to load: that is reported at once instead of at timeout.
        """
        if self._running is None:
            raise ServerError("start() the server first")
        url = f"{self.http_url}/v2/health/ready"
        timeout_s = self.options.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        answered_not_ready_at: float | None = None
        while True:
            code = self._running.process.poll()
            if code is not None:
                raise ServerError(f"tritonserver exited with code {code} before it was ready.\n{self._log_excerpt()}")
            status = http_status(url)
            if status == 200:
                return self
            now = time.monotonic()
            if status is not None:
                answered_not_ready_at = answered_not_ready_at or now
                if now - answered_not_ready_at > 1.0:
                    failed = self.unavailable_models()
                    if not self.options.require_all_models and http_status(f"{self.http_url}/v2/health/live") == 200:
                        return self  # degraded: the caller reports `failed`
                    named = "".join(f"\n  {name}: {reason}" for name, reason in failed.items())
                    raise ServerError(
                        f"tritonserver is up but not ready: some models failed to load.{named}\n" + self._log_excerpt()
                    )
            if now > deadline:
                raise ServerError(f"tritonserver was not ready after {timeout_s:.0f} s.\n{self._log_excerpt()}")
            time.sleep(0.1)

    def liveness_problem(self) -> str | None:
        """Why this server is not live (its process is gone, or a Python-backend stub died and was not brought
        back), or None. The HTTP guard answers ``/v2/health/live`` with 503 and this reason, so a liveness probe
        (Kubernetes, compose) notices what Triton's own answer hides. Cheap: called on the guard's event loop."""
        running = self._running
        if running is None or running.process.poll() is not None:
            return "tritonserver is not running"
        return running.watchdog.problem() if running.watchdog is not None else None

    def unavailable_models(self) -> dict[str, str]:
        """Models of the repository index that are not READY, with Triton's reason (e.g. the load error)."""
        try:
            index = repository_index(self.http_url, self.control_headers("http"))
        except (OSError, ValueError):
            return {}
        wanted = self.options.models
        return {
            entry["name"]: (entry.get("reason") or entry.get("state", "not loaded")).split("\n\nAt:")[0]
            for entry in index
            if entry.get("state") != "READY" and (wanted is None or entry["name"] in wanted)
        }

    def stop(self) -> int | None:
        """Stop gracefully and clean up (idempotent). Returns the server's exit code.

        First the front models are unloaded (:mod:`serving.launcher.drain`): new requests are refused, the ones they
        hold finish. Then SIGTERM: Triton waits, up to ``exit_timeout_s``, for open HTTP connections to close
        (an idle ``tritonclient.http`` client counts: close it first), then unloads the rest; past the timeout
        it exits with code 1. Interrupting this (a second Ctrl-C) is safe: call :meth:`kill` then.
        """
        if self._running is not None:
            _shutdown(self._running, graceful=True)
        return self.returncode

    def kill(self) -> int | None:
        """SIGKILL the server and its stubs at once, then clean up as :meth:`stop` does."""
        if self._running is not None:
            _shutdown(self._running, graceful=False)
        return self.returncode

    def __enter__(self) -> EmbeddedTriton:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _log_excerpt(self, max_lines: int = 40) -> str:
        """Lines saying why models failed to load, then the log tail."""
        tail = self.log_tail(400).splitlines()
        reasons = [line for line in tail if "failed to load" in line or "UNAVAILABLE" in line]
        parts = [*reasons[-10:], "--- last lines of the tritonserver log ---", *tail[-max_lines:]]
        return "\n".join(parts)


__all__: Sequence[str] = (
    "CONTROL_KEY_HEADER",
    "GRPC_CONTROL_KEY_HEADER",
    "EmbeddedTriton",
    "PortInUseError",
    "ServerError",
    "ServerOptions",
    "free_ports",
    "port_in_use",
)
