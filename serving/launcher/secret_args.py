"""Keep secret arguments off tritonserver's command line.

Triton 2.51 reads the key that locks its model-repository API only from its arguments
(``--http-restricted-api=model-repository:<header>=<key>``), and every local user can read a process's arguments
in ``/proc/<pid>/cmdline``. With the key, Triton's load API accepts model files inside the request, which for a
Python-backend model is code execution as the server's user. So the launcher passes such an argument as a
placeholder, with its value in an environment variable (which only the server's own user can read), and preloads
a small library into tritonserver (``secret_args.c``) that swaps the value in before Triton's ``main()`` runs.

The library is compiled once with the system's C compiler into the user's cache; the container images build it
beside this file (``libsecret_args.so``: not ``secret_args.so``, which Python would import as this module).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("secret_args.c")
PREBUILT = Path(__file__).with_name("libsecret_args.so")
PLACEHOLDER = "--ropeserve-secret-argument="
VARIABLE = "ROPESERVE_SECRET_ARGUMENT_"


class SecretArgumentsUnavailable(RuntimeError):
    """The preload library cannot be built here (no C compiler)."""


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ropeserve"


def library() -> Path:
    """The compiled preload library: the image's prebuilt one, else this source's build in the user's cache
    (compiled on first use)."""
    if PREBUILT.is_file():
        return PREBUILT
    source = SOURCE.read_bytes()
    target = cache_dir() / f"secret_args-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if target.is_file():
        return target
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise SecretArgumentsUnavailable(
            "the launcher keeps Triton's model-repository key off its command line with a small preloaded library "
            f"({SOURCE}), compiled once with a C compiler, and none was found: install one (Debian: "
            "apt-get install gcc), or set CC"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        result = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(built), str(SOURCE)], capture_output=True, text=True
        )
        if result.returncode != 0:
            raise SecretArgumentsUnavailable(f"compiling {SOURCE} failed:\n{result.stderr.strip()}")
        os.replace(built, target)  # atomic: launchers starting at once each see a whole file
    return target


def hide(command: list[str], secret: str, environment: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """``command`` with every argument that contains ``secret`` replaced by a placeholder, and ``environment``
    with those arguments and the preload library that puts them back."""
    hidden = {name: value for name, value in environment.items() if not name.startswith(VARIABLE)}
    shown = []
    hidden_count = 0
    for argument in command:
        if secret and secret in argument:
            hidden[f"{VARIABLE}{hidden_count}"] = argument
            argument = f"{PLACEHOLDER}{hidden_count}"
            hidden_count += 1
        shown.append(argument)
    if shown != command:
        hidden["LD_PRELOAD"] = ":".join(filter(None, [str(library()), hidden.get("LD_PRELOAD", "")]))
    return shown, hidden
