"""``python -m serving``: run the model repository on the embedded Triton server in the foreground.

This is what ``make serve`` calls once the repository is built. It streams the server log, prints one
``ropeserve: Triton ready ...`` line with the addresses, and on Ctrl-C or SIGTERM stops cleanly (no process
and no shared-memory segment left). A second Ctrl-C kills the server at once.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .launcher import stop_signals
from .launcher.embedded import EmbeddedTriton, ServerError, ServerOptions
from .launcher.gateway import Gateway, GatewayError, GatewayOptions
from .launcher.repository import find_problems

ENV_PREFIX = "ROPESERVE_"


def _env(name: str, default: str) -> str:
    return os.environ.get(ENV_PREFIX + name, default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m serving",
        description=(
            "Serve a Triton model repository (sentiment, translate, summarize) on the tritonserver 2.51 "
            "embedded in the nvidia-pytriton wheel. ONNX models run on ONNX Runtime (CPU) through the "
            "project's Python-based onnxruntime backend; front models run on the Python backend. "
            "Every option can also be set from the environment variable shown."
        ),
        epilog="Stop with Ctrl-C or SIGTERM (drains in-flight requests); Ctrl-C twice kills at once.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--model-repository",
        default=_env("MODEL_REPOSITORY", "model_repository"),
        help="model repository directory, or a URL Triton reads itself (s3://, gs://, as://) "
        "[ROPESERVE_MODEL_REPOSITORY]",
    )
    parser.add_argument("--host", default=_env("HOST", "127.0.0.1"), help="address to bind [ROPESERVE_HOST]")
    for name, port in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        parser.add_argument(
            f"--{name}-port",
            type=int,
            default=_env(f"{name.upper()}_PORT", str(port)),
            help=f"{name} port [ROPESERVE_{name.upper()}_PORT]",
        )
    parser.add_argument(
        "--gateway-port",
        type=int,
        default=_env("GATEWAY_PORT", "5000"),
        help="port of the gateway beside Triton (DeepL and LibreTranslate APIs, /v1 JSON, the page at /; "
        "python -m serving.gateway --help); 0 = no gateway. Its keys come from ROPESERVE_GATEWAY_KEYS_FILE "
        "[ROPESERVE_GATEWAY_PORT]",
    )
    parser.add_argument(
        "--models",
        default=_env("MODELS", ""),
        help="comma-separated models to load; empty loads all [ROPESERVE_MODELS]",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=_env("MAX_RESTARTS", "5"),
        help="restart a tritonserver that died on its own at most this often in 10 minutes; 0 = never "
        "[ROPESERVE_MAX_RESTARTS]",
    )
    parser.add_argument(
        "--strict",
        action=argparse.BooleanOptionalAction,
        default=_env("STRICT", "0").lower() in ("1", "true", "yes"),
        help="refuse to start when a model fails to load; by default the other models serve, readiness stays "
        "false and the failures are listed [ROPESERVE_STRICT]",
    )
    parser.add_argument(
        "--model-config-name",
        default=_env("MODEL_CONFIG_NAME", "cpu"),
        help="use <model>/configs/<name>.pbtxt where present, else config.pbtxt; 'none' for config.pbtxt "
        "only [ROPESERVE_MODEL_CONFIG_NAME]",
    )
    parser.add_argument(
        "--exit-timeout",
        type=int,
        default=_env("EXIT_TIMEOUT", "30"),
        help="seconds to drain in-flight requests on stop [ROPESERVE_EXIT_TIMEOUT]",
    )
    parser.add_argument(
        "--tritonserver",
        type=Path,
        default=_env("TRITONSERVER", "") or None,
        help="run this tritonserver binary with its own backends (e.g. /opt/tritonserver/bin/tritonserver in "
        "NGC's image: native onnxruntime on GPU) instead of the nvidia-pytriton wheel's binary with the "
        "Python-based onnxruntime backend [ROPESERVE_TRITONSERVER]",
    )
    parser.add_argument(
        "--backend-directory",
        type=Path,
        default=_env("BACKEND_DIRECTORY", "") or None,
        help="backends of --tritonserver; default: <binary>/../../backends [ROPESERVE_BACKEND_DIRECTORY]",
    )
    parser.add_argument(
        "--log-verbose",
        type=int,
        default=_env("LOG_VERBOSE", "0"),
        help="Triton verbose log level, 0 = off [ROPESERVE_LOG_VERBOSE]",
    )
    return parser


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    models = [m.strip() for m in args.models.split(",") if m.strip()] or None
    config_name = None if args.model_config_name.lower() in ("", "none") else args.model_config_name
    repository = args.model_repository if "://" in args.model_repository else Path(args.model_repository)
    return ServerOptions(
        model_repository=repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        models=models,
        model_config_name=config_name,
        exit_timeout_s=args.exit_timeout,
        log_verbose=args.log_verbose,
        require_all_models=args.strict,
        stream_log=True,
        tritonserver=args.tritonserver,
        backend_directory=args.backend_directory,
    )


def gateway_options(args: argparse.Namespace) -> GatewayOptions | None:
    if args.gateway_port == 0:
        return None
    return GatewayOptions(triton_grpc=f"127.0.0.1:{args.grpc_port}", host=args.host, port=args.gateway_port)


def start_gateway(gateway: Gateway) -> None:
    gateway.start()
    print(
        f"ropeserve: gateway ready  {gateway.url}  (DeepL /v2, LibreTranslate /translate, JSON /v1, page /)", flush=True
    )


def ready_line(server: EmbeddedTriton) -> str:
    addresses = f"HTTP {server.http_url}  gRPC {server.grpc_url}  metrics {server.metrics_url}"
    return f"ropeserve: Triton ready  {addresses}"


def _say(message: str) -> None:
    print(f"ropeserve: {message}", file=sys.stderr, flush=True)


RESTART_WINDOW_S = 600


def run(options: ServerOptions, max_restarts: int = 5, gateway_options: GatewayOptions | None = None) -> int:
    """Serve until interrupted. Exit codes: 0 stopped on request, 1 server failed, 2 repository unusable.

    A server that dies on its own (a crash) is started again, up to ``max_restarts`` times in 10 minutes;
    clients that retry (the SDK does) see the gap as a few seconds of UNAVAILABLE.
    """
    problems = (
        []
        if options.remote_repository
        else find_problems(Path(options.model_repository), options.models, options.model_config_name)
    )
    if problems:
        _say("cannot serve the model repository:\n  " + "\n  ".join(problems))
        return 2
    stop_signals.install()  # Ctrl-C and SIGTERM raise KeyboardInterrupt: the stopping path below
    server = EmbeddedTriton(options)
    gateway = Gateway(gateway_options) if gateway_options is not None else None
    restarts: list[float] = []  # when the server was restarted after dying on its own
    try:
        while True:
            server.start()
            failed = server.unavailable_models()
            if failed:
                _say(
                    "serving WITHOUT these models (readiness stays false):\n  "
                    + "\n  ".join(f"{name}: {reason}" for name, reason in failed.items())
                )
            print(ready_line(server), flush=True)
            if gateway is not None and not gateway.is_alive:
                start_gateway(gateway)  # after Triton's first start only: through a restart its client retries
            while server.is_alive:
                time.sleep(0.5)
                if gateway is not None and not gateway.is_alive:
                    _say(f"the gateway exited on its own with code {gateway.process.returncode}; restarting it")
                    start_gateway(gateway)
            code = server.returncode
            server.kill()  # reap its stubs and /dev/shm segments
            now = time.monotonic()
            restarts = [t for t in restarts if now - t < RESTART_WINDOW_S]
            if len(restarts) >= max_restarts:
                _say(
                    f"tritonserver exited on its own with code {code}; not restarting ({len(restarts)} restarts in "
                    f"the last {RESTART_WINDOW_S // 60} minutes, --max-restarts {max_restarts})"
                )
                return 1
            restarts.append(now)
            _say(f"tritonserver exited on its own with code {code}; restarting it ({len(restarts)}/{max_restarts})")
            server = EmbeddedTriton(options)
    except (ServerError, GatewayError) as exc:
        _say(str(exc))
        return 1
    except KeyboardInterrupt:
        try:  # said inside: a second Ctrl-C right after the line is read must land in the `except` below
            _say(f"stopping (draining up to {options.exit_timeout_s} s; Ctrl-C again to kill now)")
            if gateway is not None:
                gateway.stop(options.exit_timeout_s)  # first: it finishes what it holds while Triton still serves
            code = server.stop()
            _say(f"stopped (tritonserver exit code {code})")
        except KeyboardInterrupt:
            server.kill()
            _say("killed")
        return 0
    finally:
        if gateway is not None:
            gateway.stop(0)
        server.kill()  # no-op after a clean stop; otherwise nothing may outlive us


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(options_from_args(args), max_restarts=args.max_restarts, gateway_options=gateway_options(args))


if __name__ == "__main__":
    sys.exit(main())
