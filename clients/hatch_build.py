"""The wheel's task definitions: `ropeserve_client/tasks/` gets the definition reader and each task's contract
(tasks/contract_file.py), not the whole definitions: a client has no use for instance counts, queues, engine
settings or load-test texts. Hatchling runs this hook: clients/pyproject.toml, its wheel's `hooks.custom`."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

READER = ("__init__.py", "definition.py")


class ContractTasks(BuildHookInterface):  # type: ignore[misc]  # hatchling ships no type information
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        tasks = Path(self.root).resolve().parent / "tasks"
        sys.path.insert(0, str(tasks.parent))
        try:
            from tasks.contract_file import write
        finally:
            sys.path.remove(str(tasks.parent))
        self.contracts = Path(tempfile.mkdtemp(prefix="ropeserve-contracts-"))
        for name in READER:
            build_data["force_include"][str(tasks / name)] = f"tasks/{name}"
        for definition in sorted(tasks.glob("*.toml")):
            write(definition, self.contracts / definition.name)
            build_data["force_include"][str(self.contracts / definition.name)] = f"tasks/{definition.name}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        shutil.rmtree(self.contracts, ignore_errors=True)
