"""``python -m serving.gateway``: the gateway on 127.0.0.1:5000, calling Triton's gRPC port.

``make serve`` (``python -m serving``) starts it beside Triton; run it alone to put it in front of a Triton
started some other way. Every option can also be set from the environment variable shown.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Sequence
from pathlib import Path

ENV_PREFIX = "ROPESERVE_GATEWAY_"


def _env(name: str, default: str) -> str:
    return os.environ.get(ENV_PREFIX + name, default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m serving.gateway",
        description="DeepL API v2 (/v2/translate), LibreTranslate (/translate) and plain JSON (/v1/<task>) in "
        "front of the ropeserve models on Triton, with API keys, quotas, Prometheus metrics (/metrics) and a "
        "page to try it (/). The OpenAPI schema is at /openapi.json.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--host", default=_env("HOST", "127.0.0.1"), help="address to bind [ROPESERVE_GATEWAY_HOST]")
    parser.add_argument("--port", type=int, default=_env("PORT", "5000"), help="port [ROPESERVE_GATEWAY_PORT]")
    parser.add_argument(
        "--triton", default=_env("TRITON", "127.0.0.1:8001"), help="Triton's gRPC address [ROPESERVE_GATEWAY_TRITON]"
    )
    parser.add_argument(
        "--keys",
        type=Path,
        default=_env("KEYS_FILE", "") or None,
        help="TOML file of hashed API keys and their quotas (serving/gateway/keys.py); without it, "
        "$ROPESERVE_GATEWAY_KEYS may hold the same TOML; with neither, no key is asked [ROPESERVE_GATEWAY_KEYS_FILE]",
    )
    parser.add_argument(
        "--usage-file",
        type=Path,
        default=_env("USAGE_FILE", "") or None,
        help="JSON file where each key's character usage survives restarts [ROPESERVE_GATEWAY_USAGE_FILE]",
    )
    parser.add_argument(
        "--open-without-keys",
        action=argparse.BooleanOptionalAction,
        default=_env("OPEN_WITHOUT_KEYS", "0").lower() in ("1", "true", "yes"),
        help="allow a non-loopback --host with no keys configured (e.g. inside a container whose port is "
        "published on loopback only) [ROPESERVE_GATEWAY_OPEN_WITHOUT_KEYS]",
    )
    parser.add_argument(
        "--timeout", type=float, default=_env("TIMEOUT", "60"), help="seconds to wait for Triton per request"
    )
    parser.add_argument(
        "--translator",
        default=_env("TRANSLATOR", "translate"),
        help="the task DeepL's and LibreTranslate's APIs translate Chinese to English with: the built-in "
        "translate, or one imported with python -m export.import_hf [ROPESERVE_GATEWAY_TRANSLATOR]",
    )
    parser.add_argument(
        "--hash-key", action="store_true", help="read a key from stdin, print the sha256 the keys file wants, exit"
    )
    return parser


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .keys import Keys, hash_key

    if args.hash_key:
        print(hash_key(sys.stdin.readline().rstrip("\r\n")))
        return 0
    try:
        keys = Keys.configured(args.keys, args.usage_file)
    except (OSError, ValueError) as error:
        print(f"ropeserve gateway: {error}", file=sys.stderr)
        return 2
    if keys.open and not _is_loopback(args.host) and not args.open_without_keys:
        print(
            f"ropeserve gateway: refusing to serve {args.host} without API keys: anyone who reaches it could use "
            "the models. Configure keys (--keys), bind 127.0.0.1, or pass --open-without-keys.",
            file=sys.stderr,
        )
        return 2
    import uvicorn

    from .app import GatewaySettings, build_app
    from .service import TranslatorError, check_translator

    try:
        check_translator(args.translator)
    except TranslatorError as error:
        print(f"ropeserve gateway: --translator {args.translator}: {error}", file=sys.stderr)
        return 2
    settings = GatewaySettings(
        triton_url=args.triton, timeout_s=args.timeout, usage_file=args.usage_file, translator=args.translator
    )
    app = build_app(settings, keys)
    print(
        f"ropeserve gateway: starting on http://{args.host}:{args.port}  (DeepL /v2, LibreTranslate /translate "
        f"with {args.translator}, /v1, page /; {'no keys' if keys.open else f'{len(keys.accounts())} keys'})",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(
        app, host=args.host, port=args.port, log_level="warning", access_log=False, timeout_graceful_shutdown=30
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
