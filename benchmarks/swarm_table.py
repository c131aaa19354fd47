"""docs/operate.md's swarm table, written from the committed result of a `make swarm-test` run.

`make swarm-test` (and `make test`) writes build/swarm-test.json: for each phase of the run (2 replicas, a rolling
update, a killed replica, scaling 2 -> 1, 1 replica, scaling 1 -> 2), the requests the clients sent, had answered
(after retries or not) and saw fail, the time until the swarm was whole again, throughput and median latency; and
the commit and machine it ran on. This module keeps the table in the docs equal to that result:

    python -m benchmarks.swarm_table --result build/swarm-test.json   # commit a fresh run, rewrite the table
    python -m benchmarks.swarm_table                                  # rewrite the table from the committed run
    python -m benchmarks.swarm_table --check                          # exit 1 when the docs differ
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from benchmarks.markdown import committed_result_table

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "swarm.json"
DOCUMENT = ROOT / "docs" / "operate.md"
BEGIN = "<!-- swarm table: written by `python -m benchmarks.swarm_table` from benchmarks/results/swarm.json -->"
END = "<!-- swarm table end -->"
REQUIRED = (
    "deploy_to_whole_s",
    "load",
    "phases",
    "in_flight_when_killed",
    "requests_per_replica",
    "commit",
    "date",
    "cpu",
)


def table(result: dict[str, Any]) -> list[str]:
    missing = [key for key in REQUIRED if key not in result]
    if missing:
        raise ValueError(f"the swarm result lacks {', '.join(missing)} (written by an older test_swarm.py?)")
    load = result["load"]
    lines = [
        f"Measured by `make swarm-test` at commit {result['commit']} on {result['date']} ({result['cpu']}; "
        "`benchmarks/results/swarm.json`, copied from `build/swarm-test.json`). The load: "
        f"{load['workers']} SDK clients, one per endpoint ({', '.join(load['endpoints'])}) and protocol (gRPC, "
        f"HTTP), each waiting {load['pause_s']:g} s between requests; `deploy` to 2 healthy replicas took "
        f"{result['deploy_to_whole_s']:g} s.",
        "",
        "| phase | replicas | sent | answered | of which retried | failed | whole again after | answers/s | p50 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for phase in result["phases"]:
        whole = "—" if phase["whole_s"] is None else f"{phase['whole_s']:g} s"
        lines.append(
            f"| {phase['name']} | {phase['replicas']} | {phase['sent']:,} | {phase['answered']:,} | "
            f"{phase['retried']:,} | {phase['failed']:,} | {whole} | {phase['answered_per_s']:g} | "
            f"{phase['p50_ms']:g} ms |"
        )
    killed = next(phase for phase in result["phases"] if phase["name"] == "a replica killed")
    errors = "; ".join(f"`{error}`" for error in killed["errors"]) or "none"
    lines += [
        "",
        "Requests running on either replica while `docker kill` ran (an upper bound on what the killed one held): "
        f"{result['in_flight_when_killed']}; "
        f"the errors the clients saw in that phase: {errors}. Each replica's share of the steady phases' requests, as "
        "its Triton counted them (front models and the ONNX models they call): "
        + "; ".join(
            f"{replicas} replica{'s' if replicas != '1' else ''}: " + ", ".join(f"{n:,}" for n in shares)
            for replicas, shares in sorted(result["requests_per_replica"].items(), reverse=True)
        )
        + ".",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    return committed_result_table(
        argv, module="benchmarks.swarm_table", result=RESULT, document=DOCUMENT, markers=(BEGIN, END), table_of=table,
        description=__doc__.split("\n\n")[0],
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
