"""Lay out the ``--backend-directory`` the embedded server needs.

::

    <dest>/python/libtriton_python.so              real copy: Triton refuses a symlinked backend library
    <dest>/python/triton_python_backend_utils.py
    <dest>/python/triton_python_backend_stub       the stub for this interpreter's Python minor version
    <dest>/onnxruntime/model.py                    our Python-based ONNX Runtime backend (serving/ort_backend)
    <dest>/onnxruntime/ropeserve_ort_backend/      its helper modules, imported by model.py

Each server gets its own directory (the caller passes a fresh one), so servers started at the same time,
e.g. tests in parallel, never see a half-written layout, and edits to the backend apply on the next start.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .wheel import TritonWheel

ORT_BACKEND_SOURCE = Path(__file__).resolve().parents[1] / "ort_backend"
ORT_HELPER_PACKAGE = "ropeserve_ort_backend"  # the name model.py imports; distinct to avoid clashes


def build_backend_directory(dest: Path, wheel: TritonWheel) -> Path:
    """Populate ``dest`` (created if needed) and return it."""
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for source in (wheel.python_backend_library, wheel.python_backend_utils, wheel.stub):
        shutil.copy2(source, python_dir / source.name)

    ort_dir = dest / "onnxruntime"
    ort_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ORT_BACKEND_SOURCE / "model.py", ort_dir / "model.py")
    shutil.copytree(
        ORT_BACKEND_SOURCE,
        ort_dir / ORT_HELPER_PACKAGE,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "model.py"),
        dirs_exist_ok=True,
    )
    return dest
