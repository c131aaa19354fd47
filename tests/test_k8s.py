"""deploy/k8s validates offline (kubernetes-validate's bundled schemas, strict) for GPU nodes and, with the cpu
component, for nodes without one; the pod runs the launcher the images start; a broken copy does not validate.
Nothing here applies the manifests to a cluster."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from serving.__main__ import build_parser

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
VALIDATE = ROOT / "deploy" / "validate.py"
sys.path.insert(0, str(VALIDATE.parent))
from validate import stop_seconds  # noqa: E402

GPU = "nvidia.com/gpu"


def _validate_module():
    spec = importlib.util.spec_from_file_location("deploy_validate", VALIDATE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


validate_module = _validate_module()


def offline_prefix() -> list[str]:
    """`unshare -n` (no network at all) where this user may create a network namespace, as root here can."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True, check=False).returncode == 0:
        return [unshare, "-n"]
    return []


def validate(*paths: Path) -> subprocess.CompletedProcess:
    command = [*offline_prefix(), sys.executable, str(VALIDATE), *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def rendered() -> dict[str, dict]:
    """The Deployment of each variant validate.py checks ("k8s": GPU nodes, "k8s + cpu": nodes without one)."""
    variants = {}
    for name, docs, problems in validate_module.variants(K8S):
        assert not problems, problems
        variants[name] = next(doc for _, doc in docs if doc["kind"] == "Deployment")
    return variants


def test_manifests_validate_offline():
    result = validate()
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.split(":")[1].strip() for line in result.stdout.splitlines()] == ["k8s", "k8s + cpu"]


def launcher_args(deployment: dict, monkeypatch):
    """What `python -m serving` (the images' entrypoint) makes of the container's env and args."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    for item in container.get("env", []):
        if "value" in item:
            monkeypatch.setenv(item["name"], item["value"])
    return container, build_parser().parse_args(container.get("args", []))


@pytest.mark.parametrize("variant", ["k8s", "k8s + cpu"])
def test_the_pod_runs_the_launcher_which_the_probes_reach(variant, monkeypatch):
    deployment = rendered()[variant]
    container, args = launcher_args(deployment, monkeypatch)
    assert "command" not in container  # the image's entrypoint, python -m serving, not tritonserver
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > stop_seconds(args.exit_timeout)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == args.http_port  # the launcher's HTTP guard, which answers liveness
    liveness = container["livenessProbe"]["httpGet"]
    assert (liveness["path"], liveness["port"]) == ("/v2/health/live", "http")
    assert str(args.model_repository) == "/models"  # baked into both images; s3:// is the documented option
    on_gpu = GPU in container["resources"]["limits"]
    assert on_gpu == (variant == "k8s")
    assert (args.model_config_name == "cpu") == (not on_gpu)  # configs/cpu.pbtxt exactly where there is no GPU
    assert container["image"].endswith(":gpu" if on_gpu else ":cpu")


def test_rendering_agrees_with_kustomize(tmp_path):
    """validate.py renders the cpu component itself (no binary needed); kubectl's kustomize must agree."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "this test needs kubectl (its built-in kustomize): https://kubernetes.io/docs/tasks/tools/"
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    up = os.path.relpath(K8S, overlay)  # kustomize refuses absolute paths
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({"resources": [up], "components": [f"{up}/cpu"]}))
    for name, folder in (("k8s", K8S), ("k8s + cpu", overlay)):
        output = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=True)
        theirs = next(doc for doc in yaml.safe_load_all(output.stdout) if doc["kind"] == "Deployment")
        ours = rendered()[name]
        for deployment in (theirs, ours):  # env order differs (kustomize moves patched items first)
            for container in deployment["spec"]["template"]["spec"]["containers"]:
                container["env"] = sorted(container["env"], key=lambda e: e["name"])
        assert ours == theirs, name


def write_broken_copy(tmp_path: Path, file: str, old: str, new: str) -> Path:
    folder = tmp_path / "k8s"
    shutil.copytree(K8S, folder)
    text = (folder / file).read_text()
    assert old in text
    (folder / file).write_text(text.replace(old, new, 1))
    return folder


def test_schema_errors_are_caught(tmp_path):
    folder = write_broken_copy(tmp_path, "deployment.yaml", "terminationGracePeriodSeconds:", "gracePeriod:")
    result = validate(*sorted(folder.glob("*.yaml")))
    assert result.returncode == 1 and "'gracePeriod' was unexpected" in result.stdout, result.stdout


def test_broken_links_between_objects_are_caught(tmp_path):
    folder = write_broken_copy(tmp_path, "hpa.yaml", "name: ropeserve_waiting_work", "name: ropeserve_waiting")
    result = validate(*sorted(folder.glob("*.yaml")))
    assert result.returncode == 1 and "ropeserve_waiting is not served by the adapter rules" in result.stdout
    folder = write_broken_copy(tmp_path / "b", "service.yaml", "targetPort: grpc", "targetPort: grcp")
    result = validate(*sorted(folder.glob("*.yaml")))
    assert result.returncode == 1 and "targets 'grcp', not a container port" in result.stdout


@pytest.mark.parametrize(
    ("file", "old", "new", "message"),
    [
        # bare tritonserver would lose the stub watchdog, the drain and the HTTP guard that answers liveness
        (
            "deployment.yaml",
            "          env:\n",
            "          command: [tritonserver]\n          env:\n",
            "k8s: the container must run the image's launcher",
        ),
        ("deployment.yaml", "path: /v2/health/live", "path: /v2/health/ready", "probes should be"),
        (
            "deployment.yaml",
            'value: "30"',
            'value: "60"',
            "must exceed the launcher's longest stop, 125 s for exit timeout 60",
        ),
        # the cpu component forgets the CPU configs: a pod without a GPU would load KIND_GPU config.pbtxt
        (
            "cpu/deployment-cpu.yaml",
            "value: cpu",
            "value: none",
            "k8s + cpu: the pod has no nvidia.com/gpu but would serve config.pbtxt",
        ),
        ("cpu/deployment-cpu.yaml", "- name: triton", "- name: trtion", "patches container 'trtion'"),
        ("cpu/deployment-cpu.yaml", "name: ropeserve-triton", "name: ropeserve", "Deployment/ropeserve, which is"),
    ],
)
def test_a_broken_copy_is_rejected(tmp_path, file, old, new, message):
    folder = write_broken_copy(tmp_path, file, old, new)
    result = validate(folder)
    assert result.returncode == 1 and message in result.stdout, result.stdout
