"""docs/architecture.md's Layout section against the tree: every file and folder it names exists where it says, and
every package of serving/ and export/ is named (a folder moved or added without the docs fails here)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMED = re.compile(r"(?<![\w./-])([\w.-]+(?:/[\w.-]+)*(?:/|\.(?:py|c|toml|pbtxt|yml)))(?![\w])")


def layout_entries() -> dict[str, str]:
    """Top-level entry → its description (continuation lines joined)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            current, _, rest = line.partition(" ")
            entries[current] = rest
        elif current is not None:
            entries[current] += " " + line.strip()
    return entries


def test_every_named_file_and_folder_exists_under_its_entry():
    entries = layout_entries()
    assert {"serving/", "export/", "clients/", "tasks/", "tests/", "model_repository/"} <= set(entries)
    missing = []
    for entry, description in entries.items():
        base = ROOT / entry.rstrip("/")
        assert base.exists(), f"the layout names {entry}, which is not in the tree"
        if not base.is_dir():
            continue
        for name in NAMED.findall(description):
            if name.startswith(("~", ".cache")) or "<" in name:
                continue
            target = name.rstrip("/")
            if not ((base / target).exists() or any(base.rglob(target)) or (ROOT / target).exists()):
                missing.append(f"{entry} names {name}")
    assert not missing, missing


def test_every_package_of_serving_and_export_is_named():
    entries = layout_entries()
    unnamed = [
        f"{top}/{package.name}/"
        for top in ("serving", "export")
        for package in sorted((ROOT / top).iterdir())
        if (package / "__init__.py").is_file() and f"{package.name}/" not in entries[f"{top}/"]
    ]
    assert not unnamed, f"packages the layout does not mention: {unnamed}"
