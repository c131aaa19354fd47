"""The SDK installs alone (clients/pyproject.toml): in a fresh venv on Python 3.11 and on a newer Python it brings
tritonclient and numpy, none of the trainer or the server, no generic top-level name, and its `ropeserve` command
and `ropeserve_client` package call a running server."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = ("3.11", "3.13")
TRAINER_AND_SERVER = {"torch", "onnx", "onnxruntime", "onnxscript", "nvidia-pytriton", "tokenizers"}
OUR_GENERIC_NAMES = {"export", "serving", "tasks", "clients", "loadtest", "benchmarks"}


def run(*command, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command}: {result.stdout[-2000:]}{result.stderr[-3000:]}"
    return result


def interpreter(version: str) -> str | None:
    """A working python<version>: on PATH, or one pyenv installed (its shims only answer for the global ones)."""
    candidates = [
        shutil.which(f"python{version}"),
        *map(str, Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}")),
    ]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "--version"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The SDK's wheel, built once from clients/ the way `pip install ./clients` builds it."""
    out = tmp_path_factory.mktemp("sdk-wheel")
    run(
        ROOT / ".venv" / "bin" / "python",
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "-w",
        out,
        ROOT / "clients",
        cwd=out,
    )
    (built,) = out.glob("ropeserve_client-*.whl")
    return built


def test_the_wheel_carries_the_tasks_contracts_not_their_server_settings(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        translate = archive.read("ropeserve_client/tasks/translate.toml").decode("utf-8")
    assert {f"ropeserve_client/tasks/{name}.toml" for name in ("translate", "summarize", "sentiment")} <= names
    assert "ropeserve_client/tasks/definition.py" in names
    assert not any(name.endswith(("hatch_build.py", "triton_config.py")) for name in names), sorted(names)
    assert "contract = true" in translate and "instances" not in translate and "[loadtest]" not in translate


@pytest.mark.parametrize("version", PYTHONS)
def test_the_sdk_installs_alone_and_calls_the_server(version, wheel, triton, tmp_path):
    python = interpreter(version)
    assert python, f"python{version} is needed for this test (the SDK supports 3.10 and newer)"
    venv = tmp_path / "venv"
    run(python, "-m", "venv", venv, cwd=tmp_path)  # cwd outside the checkout: nothing of ours is importable
    run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel, cwd=tmp_path)

    installed = {
        p["name"].lower() for p in json.loads(run(venv / "bin" / "pip", "list", "--format=json", cwd=tmp_path).stdout)
    }
    assert {"tritonclient", "numpy", "ropeserve-client"} <= installed
    assert not installed & TRAINER_AND_SERVER, installed & TRAINER_AND_SERVER
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    assert not {p.name for p in site.iterdir()} & OUR_GENERIC_NAMES

    assert "translate" in run(venv / "bin" / "ropeserve", "--help", cwd=tmp_path).stdout
    answer = run(
        venv / "bin" / "ropeserve", "--url", triton.grpc_url, "--json", "sentiment", "这部电影不差", cwd=tmp_path
    )
    assert json.loads(answer.stdout.splitlines()[0])["label"] in ("positive", "negative")
    program = (
        "from ropeserve_client import Client\n"
        f"with Client({triton.http_address!r}, protocol='http') as client:\n"
        "    print(client.translate('我爱你。', num_beams=1)[0])\n"
    )
    assert run(venv / "bin" / "python", "-c", program, cwd=tmp_path).stdout.strip()
