"""``python -m serving.launcher.probe ready|live``: exit 0 when the local server answers 200, 1 otherwise.

The container health check (no curl in the image). ``live`` goes through the launcher's HTTP guard, which
answers 503 when a Python-backend stub died and was not brought back (Triton's own answer would say 200).
"""

from __future__ import annotations

import argparse
import os
import sys

from .control import http_status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.launcher.probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["ready", "live"])
    parser.add_argument(
        "--url",
        default=f"http://127.0.0.1:{os.environ.get('ROPESERVE_HTTP_PORT', '8000')}",
        help="the server's HTTP address (default: this host, port ROPESERVE_HTTP_PORT or 8000)",
    )
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    args = parser.parse_args(argv)
    status = http_status(f"{args.url}/v2/health/{args.what}", timeout_s=args.timeout)
    if status != 200:
        print(f"{args.what}: {'no answer' if status is None else f'HTTP {status}'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
