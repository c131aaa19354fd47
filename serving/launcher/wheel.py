"""Where the pieces of Triton 2.51 live inside the installed ``nvidia-pytriton`` wheel, and how to run them.

The wheel ships a complete ``tritonserver`` binary, its shared libraries (``nvidia_pytriton.libs``, hashed
names, found through ``LD_LIBRARY_PATH``), the Python backend and one Python-backend stub per Python minor
version. We use them directly instead of pytriton's own Python API, so the server runs a plain Triton
model repository exactly as the NGC image would.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


class TritonNotInstalledError(RuntimeError):
    """The ``nvidia-pytriton`` wheel, or a file we need from it, is missing."""


@dataclass(frozen=True)
class TritonWheel:
    """Paths inside the installed wheel. ``root`` is ``<site-packages>/pytriton/tritonserver``."""

    root: Path
    libs: Path

    @classmethod
    def locate(cls) -> TritonWheel:
        """Find the wheel without importing ``pytriton`` (its import is slow and pulls in extra modules)."""
        spec = importlib.util.find_spec("pytriton")
        if spec is None or not spec.submodule_search_locations:
            raise TritonNotInstalledError("nvidia-pytriton is not installed: pip install 'nvidia-pytriton==0.7.0'")
        package = Path(next(iter(spec.submodule_search_locations)))
        wheel = cls(root=package / "tritonserver", libs=package.parent / "nvidia_pytriton.libs")
        for path in (
            wheel.binary,
            wheel.libs,
            wheel.python_backend_library,
            wheel.python_backend_utils,
            wheel.stub,
        ):
            if not path.exists():
                raise TritonNotInstalledError(f"the nvidia-pytriton wheel lacks {path}")
        return wheel

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def python_backend_library(self) -> Path:
        return self.root / "backends" / "python" / "libtriton_python.so"

    @property
    def python_backend_utils(self) -> Path:
        return self.root / "backends" / "python" / "triton_python_backend_utils.py"

    @property
    def caches(self) -> Path:
        """Response-cache plugins (``local``), for ``--cache-directory``."""
        return self.root / "caches"

    @property
    def stub(self) -> Path:
        """The Python-backend stub built for this interpreter's minor version (it embeds libpython3.X)."""
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        return self.root / "python_backend_stubs" / version / "triton_python_backend_stub"

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for ``tritonserver``: its libraries, and this interpreter's ``python3`` first on PATH.

        The stub picks its Python by running ``python3`` from PATH, so the venv's ``bin`` must come first or
        the stub would import onnxruntime/numpy from somewhere else (or not at all).
        """
        env = dict(os.environ if base is None else base)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(self.libs), env.get("LD_LIBRARY_PATH")) if p)
        python_bin = interpreter_bin()
        env["PATH"] = os.pathsep.join(p for p in (str(python_bin), env.get("PATH")) if p)
        return env


def interpreter_bin() -> Path:
    """The directory of this interpreter, unresolved (resolving a venv's symlink would leave the venv)."""
    python_bin = Path(sys.executable).parent
    if not (python_bin / "python3").exists():
        raise TritonNotInstalledError(f"{python_bin} has no python3; the Python-backend stub needs one on PATH")
    return python_bin


def warn_if_numpy_2() -> None:
    """With numpy 2 the 2.51 stub crashes on BYTES tensors and the server hangs (measured): say so early."""
    try:
        major = int(importlib.metadata.version("numpy").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return
    if major >= 2:
        warnings.warn(
            "numpy>=2 is installed: Triton 2.51's Python-backend stub crashes on BYTES tensors with it; "
            "install numpy<2",
            RuntimeWarning,
            stacklevel=3,
        )
