"""deploy/k8s validates offline (kubernetes-validate's bundled schemas, strict), and a broken copy does not."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
VALIDATE = ROOT / "deploy" / "validate.py"


def offline_prefix() -> list[str]:
    """`unshare -n` (no network at all) where this user may create a network namespace, as root here can."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True, check=False).returncode == 0:
        return [unshare, "-n"]
    return []


def validate(*paths: Path) -> subprocess.CompletedProcess:
    command = [*offline_prefix(), sys.executable, str(VALIDATE), *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_manifests_validate_offline():
    result = validate()
    assert result.returncode == 0, result.stdout + result.stderr
    kinds = "ConfigMap, Deployment, HorizontalPodAutoscaler, Kustomization, PodMonitor, Service"
    assert f"6 objects ({kinds})" in result.stdout


def test_deployment_probes_resources_and_object_storage():
    deployment = yaml.safe_load((K8S / "deployment.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MODEL_REPOSITORY"].startswith("s3://") and "--model-repository=$(MODEL_REPOSITORY)" in container["args"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    hpa = yaml.safe_load((K8S / "hpa.yaml").read_text())
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "triton_queue_compute_ratio"


def write_broken_copy(tmp_path: Path, file: str, old: str, new: str) -> Path:
    folder = tmp_path / "k8s"
    shutil.copytree(K8S, folder)
    text = (folder / file).read_text()
    assert old in text
    (folder / file).write_text(text.replace(old, new, 1))
    return folder


def test_schema_errors_are_caught(tmp_path):
    folder = write_broken_copy(
        tmp_path, "deployment.yaml", "      terminationGracePeriodSeconds: 60", "      gracePeriod: 60"
    )
    result = validate(*sorted(folder.glob("*.yaml")))
    assert result.returncode == 1 and "'gracePeriod' was unexpected" in result.stdout, result.stdout


def test_broken_links_between_objects_are_caught(tmp_path):
    folder = write_broken_copy(tmp_path, "hpa.yaml", "name: triton_queue_compute_ratio", "name: triton_queue_ratio")
    result = validate(*sorted(folder.glob("*.yaml")))
    assert result.returncode == 1 and "triton_queue_ratio is not served by the adapter rules" in result.stdout
    folder = write_broken_copy(tmp_path / "b", "service.yaml", "targetPort: grpc", "targetPort: grcp")
    result = validate(*sorted(folder.glob("*.yaml")))
    assert result.returncode == 1 and "targets 'grcp', not a container port" in result.stdout
