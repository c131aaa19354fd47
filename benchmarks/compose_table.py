"""docs/operate.md's compose table, written from the committed result of a `make compose-test` run.

`make compose-test` (and `make test`) writes build/compose-test.json: how long the stand-in base images, the build
and `up` to ready took, the images' sizes, the containers' memory after the checks, the drain, and the commit and
machine it ran on. This module keeps the table in the docs equal to that result:

    python -m benchmarks.compose_table --result build/compose-test.json   # commit a fresh run, rewrite the table
    python -m benchmarks.compose_table                                    # rewrite the table from the committed run
    python -m benchmarks.compose_table --check                            # exit 1 when the docs differ
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from benchmarks.markdown import committed_result_table

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "compose.json"
DOCUMENT = ROOT / "docs" / "operate.md"
BEGIN = "<!-- compose table: written by `python -m benchmarks.compose_table` from benchmarks/results/compose.json -->"
END = "<!-- compose table end -->"
REQUIRED = ("base_images_s", "build_s", "up_to_ready_s", "memory", "image_bytes", "drain", "commit", "date", "cpu")


def _megabytes(count: int) -> str:
    return f"{count / 1e6:,.0f} MB"


def _container(memory: dict[str, str], service: str) -> str:
    """`docker stats`' "used / limit" of the service's container (compose names it <project>_<service>_1)."""
    used = [value.split("/")[0].strip() for name, value in memory.items() if f"_{service}_" in name]
    return used[0] if used else "not measured"


def table(result: dict[str, Any]) -> list[str]:
    missing = [key for key in REQUIRED if key not in result]
    if missing:
        raise ValueError(f"the compose result lacks {', '.join(missing)} (written by an older test_compose_stack.py?)")
    images = result["image_bytes"]
    sizes = ", ".join(f"`{name}` {_megabytes(size)}" for name, size in sorted(images.items()))
    drain = result["drain"]
    answered = f"{drain['answered']} of {drain['requests_in_flight_at_stop']} answered"
    return [
        f"Measured by `make compose-test` at commit {result['commit']} on {result['date']} ({result['cpu']}; "
        "`benchmarks/results/compose.json`, copied from `build/compose-test.json`):",
        "",
        "| | |",
        "|---|---|",
        f"| the two stand-in base images (mmdebstrap, import, Prometheus from Debian; seconds when they already exist) "
        f"| {result['base_images_s']:g} s |",
        f"| `docker-compose build` of the Triton and locust images (export stage included) | {result['build_s']:g} s |",
        f"| `up -d` → ready through the HTTP front | {result['up_to_ready_s']:g} s |",
        f"| image sizes | {sizes} |",
        f"| memory after the checks (`docker stats`) | Triton {_container(result['memory'], 'triton')} (every model of "
        f"the repository), Prometheus {_container(result['memory'], 'prometheus')} |",
        f"| `docker compose stop` with requests in flight | {answered} |",
    ]


def main(argv: list[str] | None = None) -> int:
    return committed_result_table(
        argv, module="benchmarks.compose_table", result=RESULT, document=DOCUMENT, markers=(BEGIN, END), table_of=table,
        description=__doc__.split("\n\n")[0],
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
