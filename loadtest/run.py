"""``python -m loadtest.run`` (what ``make loadtest`` calls): locust headless for a bounded time, then the report.

Writes into ``<results-dir>/<timestamp>/``: ``locust_stats.csv``, ``locust_stats_history.csv``,
``locust_failures.csv``, ``locust_exceptions.csv``, ``locust_sentences.json`` (sentences per request name),
``locust_streams.json`` (when the mix has streaming twins: each streamed answer's first-piece, between-pieces and
whole times), ``report.html`` (locust's), ``plot.png`` (throughput and p50/p95/p99 over time, each request name's p50
when paragraphs are sent, the streams' first-piece and whole p50), ``summary.txt`` / ``summary.json`` and
``locust.log``. Prints the summary table and
exits 0 when the failure ratio and the p99 are within the limits, 1 when not, 2 when locust itself failed.
The server must already run (``make serve``, or ``docker compose up``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

from loadtest.report import write_report
from loadtest.texts import (
    DEFAULT_PARAGRAPHS,
    add_option_flags,
    default_mix,
    option_flag,
    options,
    paragraph_endpoints,
    parse_mix,
    parse_paragraphs,
)

ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
USER_CLASSES = {"grpc": "GrpcTritonUser", "http": "HttpTritonUser", "gateway": "GatewayUser"}
PREFIX = "locust"


def parse_duration(text: str) -> int:
    """``"30"``, ``"30s"``, ``"2m"`` → seconds."""
    text = text.strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in "smh" else text
    seconds = int(float(number) * scale)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive, got {text!r}")
    return seconds


def _share(text: str) -> float:
    try:
        return parse_paragraphs(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="http://127.0.0.1:8000", help="Triton HTTP URL (default: %(default)s)")
    p.add_argument("--grpc-host", default="", help="Triton gRPC host:port (default: HTTP host, port 8001)")
    p.add_argument("--users", type=int, default=8, help="concurrent users (default: %(default)s)")
    p.add_argument("--spawn-rate", type=float, default=0, help="users started per second (default: all at once)")
    p.add_argument("--duration", type=parse_duration, default="30s", help="run time, e.g. 30s, 2m")
    p.add_argument("--mix", default=default_mix(), help="endpoint weights (default: %(default)s)")
    p.add_argument(
        "--paragraphs",
        type=_share,
        default=DEFAULT_PARAGRAPHS,
        help=f"share of the {', '.join(paragraph_endpoints())} requests that send a paragraph of 4-8 test sentences"
        " joined, reported as '<endpoint> (paragraph)'; 0: single texts only (default: %(default)s)",
    )
    p.add_argument(
        "--protocols",
        default="grpc,http",
        help="grpc, http and/or gateway (the gateway's routes: DeepL /v2/translate for translate, /v1/<task> and "
        "/v1/<task>/stream for the others; users split evenly)",
    )
    p.add_argument("--gateway-host", default="http://127.0.0.1:5000", help="the gateway's URL (default: %(default)s)")
    p.add_argument("--gateway-key", default="", help="API key for the gateway, if it asks for one")
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"), help="test sets (else built-in)")
    add_option_flags(p)
    p.add_argument("--max-failure-ratio", type=float, default=0.01, help="fail above this (default: %(default)s)")
    p.add_argument("--max-p99-ms", type=float, default=10_000, help="fail above this p99 (default: %(default)s)")
    p.add_argument("--results-dir", type=Path, default=ROOT / "loadtest" / "results", help="parent of the run dir")
    p.add_argument("--wait-ready", type=float, default=0, help="wait up to this many seconds for the server first")
    return p


def wait_ready(http_url: str, timeout_s: float) -> bool:
    """Poll ``/v2/health/ready`` until it answers 200 (the compose locust service starts beside Triton)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{http_url.rstrip('/')}/v2/health/ready", timeout=3) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(2)


def locust_command(args: argparse.Namespace, out_dir: Path) -> list[str]:
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    unknown = sorted(set(protocols) - set(USER_CLASSES))
    if unknown or not protocols:
        raise SystemExit(f"--protocols must name grpc, http and/or gateway, got {args.protocols!r}")
    grpc_host = args.grpc_host or default_grpc_host(args.host)
    return [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--users",
        str(args.users),
        "--spawn-rate",
        str(args.spawn_rate or args.users),
        "--run-time",
        f"{args.duration}s",
        "--stop-timeout",
        "10",
        "--host",
        args.host,
        "--grpc-host",
        grpc_host,
        "--gateway-host",
        args.gateway_host,
        *(["--gateway-key", args.gateway_key] if args.gateway_key else []),
        "--mix",
        args.mix,
        "--data-dir",
        args.data_dir,
        "--paragraphs",
        str(args.paragraphs),
        # only the options that were set: "" is no string option's choice, and locust's own default is "unset"
        *(
            arg
            for keyword in options()
            if getattr(args, keyword)
            for arg in (option_flag(keyword), str(getattr(args, keyword)))
        ),
        "--csv",
        str(out_dir / PREFIX),
        "--csv-full-history",
        "--html",
        str(out_dir / "report.html"),
        "--only-summary",
        "--exit-code-on-error",
        "0",  # the verdict is ours (failure ratio and p99), not "any failure"
        "--loglevel",
        "WARNING",
        *[USER_CLASSES[p] for p in dict.fromkeys(protocols)],
    ]


def default_grpc_host(http_url: str) -> str:
    host = http_url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
    return f"{host}:8001"


def new_run_dir(parent: Path) -> Path:
    """``<parent>/<timestamp>``, with a suffix when a run already started in the same second."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1, 100):
        out_dir = parent / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            out_dir.mkdir(parents=True)
            return out_dir
        except FileExistsError:
            continue
    raise SystemExit(f"loadtest: cannot create a run directory under {parent}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    parse_mix(args.mix)  # refuse a bad mix before starting anything
    if args.wait_ready and not wait_ready(args.host, args.wait_ready):
        print(f"loadtest: {args.host} was not ready after {args.wait_ready:.0f} s")
        return 2
    out_dir = new_run_dir(Path(args.results_dir))
    command = locust_command(args, out_dir)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    print(f"loadtest: {args.users} users for {args.duration}s against {args.host} → {out_dir}", flush=True)
    with open(out_dir / "locust.log", "wb") as log:
        # locust's own time limit stops the run; this one only guards against a hang at exit
        completed = subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   timeout=args.duration + 60, check=False)  # fmt: skip
    if completed.returncode != 0 or not (out_dir / f"{PREFIX}_stats.csv").exists():
        sys.stdout.write((out_dir / "locust.log").read_text(errors="replace")[-4000:])
        print(f"loadtest: locust failed (exit code {completed.returncode}); log in {out_dir / 'locust.log'}")
        return 2
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    text, verdict = write_report(out_dir, PREFIX, args.max_failure_ratio, args.max_p99_ms, settings)
    print(text, end="")
    print(f"loadtest: results in {out_dir}")
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
