"""`python -m tasks`: list the task definitions, generate the Triton configs from them, or check for drift."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .definition import PATH_VARIABLE, DefinitionError, Task, registry

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tasks",
        description=(
            "Each task is defined once in tasks/<name>.toml (more folders of definitions: "
            f"${PATH_VARIABLE}). The Triton configs of the model repository are generated from them."
        ),
    )
    parser.add_argument(
        "command",
        choices=("list", "generate", "check"),
        help="list: the tasks and their options; generate: write the configs; check: fail if they differ",
    )
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository", help="default: %(default)s")
    parser.add_argument("--task", action="append", metavar="NAME", help="only these tasks (repeatable)")
    args = parser.parse_args(argv)
    try:
        tasks = registry()
    except DefinitionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    unknown = sorted(set(args.task or ()) - set(tasks))
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}; defined: {', '.join(tasks)}")
    if args.task:
        tasks = {name: task for name, task in tasks.items() if name in args.task}
    if args.command == "list":
        for task in tasks.values():
            options = "; ".join(f"{o.keyword} {o.allowed} (default {o.default})" for o in task.options)
            endpoints = ", ".join(e.name for e in task.endpoints())
            print(f"{task.name}\t{endpoints}\t{options or 'no options'}\t{task.source}")
        return 0

    from . import triton_config  # needs tritonclient's protobuf classes; `list` does not

    if args.command == "generate":
        for task in tasks.values():
            for path in triton_config.write(task, args.repository):
                print(f"wrote {path}")
        return 0
    problems = [problem for task in tasks.values() for problem in triton_config.drift(task, args.repository)]
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print("run `python -m tasks generate` and commit the result", file=sys.stderr)
        return 1
    broken = [problem for task in tasks.values() for problem in generation_problems(task, args.repository)]
    for problem in broken:
        print(problem, file=sys.stderr)
    if broken:
        print("the generation graphs break tasks/generation_contract.py: rebuild them", file=sys.stderr)
        return 1
    print(f"{args.repository}: the configs of {len(tasks)} tasks match their definitions, their graphs the contract")
    return 0


def generation_problems(task: Task, repository: Path) -> list[str]:
    """Where the built step graphs of the task's engine endpoints break the generation contract, and where its
    num_beams range asks for more beams than the contract's top-k serves. An endpoint not built yet is skipped."""
    from . import generation_contract as contract

    problems = []
    for endpoint in task.endpoints():
        folder = repository / endpoint.name / "1"
        if not (folder / contract.graph_files(endpoint.precision)[-1]).is_file():
            continue  # not a generation engine's folder, or not built
        problems += contract.check_graphs(folder, endpoint.precision)
        beams = next((option for option in task.options if option.keyword == "num_beams"), None)
        if beams is not None and beams.high > contract.MAX_BEAMS:
            problems.append(f"{task.source}: num_beams goes up to {beams.high}; the graphs serve {contract.MAX_BEAMS}")
    return problems


if __name__ == "__main__":
    raise SystemExit(main())
