"""Print pinned requirements for the named packages, with the pins taken from pyproject.toml.

The container images install a few of the project's dependencies, not the whole project (the serving image
needs no torch). This keeps their versions in one place: a Dockerfile names the packages, pyproject.toml
pins them. It runs on Python 3.10 too (the NGC image), so it reads the quoted requirement strings of
pyproject.toml instead of importing tomllib.

    python deploy/requirements.py numpy onnxruntime tokenizers        # one requirement per line
    python deploy/requirements.py --dockerfile serving/Dockerfile     # what its pip-install lines install
    python deploy/requirements.py --no-deps --dockerfile serving/Dockerfile   # ... those with --no-deps

``make wheelhouse`` uses the second form, so the wheelhouse holds what the Dockerfiles install.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# in the repository: ../pyproject.toml; in an image build, the Dockerfile copies both into one folder
PYPROJECT = next((p for p in (HERE.parent / "pyproject.toml", HERE / "pyproject.toml") if p.exists()), HERE)
# "name[extras]==1.2" or "name>=1,<2": a quoted string that starts with a distribution name and a specifier
REQUIREMENT = re.compile(r'"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?((?:==|>=|<=|~=|<|>)[^"]*)"')


def normalise(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(pyproject_text: str) -> dict[str, str]:
    """Normalised name → the requirement string as pyproject.toml writes it (extras kept)."""
    found: dict[str, str] = {}
    for match in REQUIREMENT.finditer(pyproject_text):
        found.setdefault(normalise(match.group(1)), match.group(0).strip('"'))
    return found


def requirements(names: list[str], pyproject_text: str | None = None) -> list[str]:
    """The pinned requirement of each name; a name pyproject.toml does not pin is an error."""
    pins = pinned(pyproject_text if pyproject_text is not None else PYPROJECT.read_text())
    missing = [name for name in names if normalise(name) not in pins]
    if missing:
        raise SystemExit(f"pyproject.toml pins no {', '.join(missing)}")
    return [pins[normalise(name)] for name in names]


def dockerfile_names(dockerfile_text: str, no_deps: bool) -> list[str]:
    """Package names of the ``/build/pip-install`` commands of a Dockerfile, with or without ``--no-deps``."""
    names: list[str] = []
    for command in re.findall(r"/build/pip-install\b([^&;\n]*)", dockerfile_text.replace("\\\n", " ")):
        words = command.replace("\\", " ").split()
        if ("--no-deps" in words) == no_deps:
            names += [word for word in words if word != "--no-deps" and word not in names]
    return names


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    no_deps = "--no-deps" in argv
    argv = [arg for arg in argv if arg != "--no-deps"]
    names: list[str] = []
    while argv:
        arg = argv.pop(0)
        if arg == "--dockerfile":
            found = dockerfile_names(Path(argv.pop(0)).read_text(), no_deps)
            names += [name for name in found if name not in names]
        else:
            names.append(arg)
    print("\n".join(requirements(names)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
