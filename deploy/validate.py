"""Validate the Kubernetes manifests offline: schemas, then the links between the objects.

``python deploy/validate.py [FOLDER | FILES...]`` (``make kubernetes-validate``; default: the folder deploy/k8s).

A folder is checked as each variant ``kubectl apply -k`` can make of it: its manifests (with the components its
kustomization names), and the same again with each kustomize Component in a sub-folder (``cpu/``: nodes without
a GPU). The components are rendered here (strategic-merge patches, the subset kustomize applies to these files);
``tests/test_k8s.py`` compares the result with ``kubectl kustomize`` where kubectl is installed.

1. Every built-in object is checked strictly (unknown fields are errors) against the OpenAPI schemas that
   ship inside the ``kubernetes-validate`` wheel, for each Kubernetes version in ``VERSIONS``. Nothing is
   fetched: the wheel's ``-local`` schemas resolve their references from disk.
2. Custom resources (the Prometheus Operator's PodMonitor) have no schema there; they and the objects are
   checked against each other instead: the Service and PodMonitor select the Deployment's pods and name
   its ports, probes use declared ports, the HPA scales the Deployment on the metric the Prometheus
   adapter rule serves, and the kustomization lists files that exist.
3. The pod runs the images' launcher (``python -m serving``: no ``command``, no tritonserver arguments), the
   grace period outlasts the launcher's drain (``ROPESERVE_EXIT_TIMEOUT``), and a pod without a GPU uses
   ``configs/cpu.pbtxt`` (``ROPESERVE_MODEL_CONFIG_NAME=cpu``) while one with a GPU does not.

Exit status 0 when all is well, 1 with one line per problem otherwise.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import kubernetes_validate
import yaml

K8S_DIR = Path(__file__).resolve().parent / "k8s"
VERSIONS = ("1.29.0", "1.37.0")
NOT_IN_SCHEMAS = {"monitoring.coreos.com/v1": {"PodMonitor"}, "kustomize.config.k8s.io/v1beta1": {"Kustomization"}}
GPU_RESOURCE = "nvidia.com/gpu"
# Strategic-merge keys of the lists patched here (Kubernetes' patchMergeKey); any other list is replaced whole.
MERGE_KEYS = {"containers": "name", "env": "name", "volumes": "name", "volumeMounts": "mountPath"}


def stop_seconds(exit_timeout: int) -> int:
    """The longest a launcher takes to stop: the front models drain (up to the exit timeout), then tritonserver
    gets SIGTERM and up to the exit timeout again, plus 5 s (serving.launcher.embedded._shutdown)."""
    return 2 * exit_timeout + 5


def load(paths: list[Path]) -> list[tuple[Path, dict]]:
    docs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            docs += [(path, doc) for doc in yaml.safe_load_all(f) if doc]
    return docs


def merge(base, patch, key: str = ""):
    """Strategic merge of ``patch`` into ``base``: maps merge, ``null`` deletes a key, the lists in
    ``MERGE_KEYS`` merge item by item on their key; a patched container must exist in ``base``."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for name, value in patch.items():
            if name.startswith("$"):
                raise ValueError(f"the directive {name} is not rendered by validate.py")
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = merge(base[name], value, name) if name in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        merged, field = [copy.deepcopy(item) for item in base], MERGE_KEYS[key]
        for item in patch:
            at = next((i for i, old in enumerate(merged) if old.get(field) == item.get(field)), None)
            if at is not None:
                merged[at] = merge(merged[at], item)
            elif key == "containers":
                raise ValueError(f"it patches container {item.get(field)!r}, which is not there")
            else:
                merged.append(copy.deepcopy(item))
        return merged
    return copy.deepcopy(patch)


def _identity(doc: dict) -> tuple:
    return doc.get("apiVersion"), doc.get("kind"), doc.get("metadata", {}).get("name")


def apply_component(docs: list[tuple[Path, dict]], folder: Path) -> tuple[list[tuple[Path, dict]], list[str]]:
    """``docs`` with the kustomize Component in ``folder`` applied (its ``patches: - path:`` entries)."""
    kustomization = folder / "kustomization.yaml"
    if not kustomization.is_file():
        return docs, [f"component {folder.name}: no kustomization.yaml"]
    component = load([kustomization])[0][1]
    unknown = set(component) - {"apiVersion", "kind", "metadata", "patches"}
    if component.get("kind") != "Component" or unknown:
        what = unknown or component.get("kind")
        return docs, [f"component {folder.name}: validate.py renders a Component of patches only, not {what}"]
    docs, problems = list(docs), []
    for entry in component.get("patches", []):
        if set(entry) != {"path"}:
            problems.append(f"component {folder.name}: validate.py renders `- path:` patches only, not {entry}")
            continue
        for _, patch in load([folder / entry["path"]]):
            at = [i for i, (_, doc) in enumerate(docs) if _identity(doc) == _identity(patch)]
            if not at:
                _, kind, name = _identity(patch)
                problems.append(f"{folder.name}/{entry['path']} patches {kind}/{name}, which is not in the base")
                continue
            path, doc = docs[at[0]]
            try:
                docs[at[0]] = (path, merge(doc, patch))
            except ValueError as err:
                problems.append(f"{folder.name}/{entry['path']}: {err}")
    return docs, problems


def variants(folder: Path) -> list[tuple[str, list[tuple[Path, dict]], list[str]]]:
    """(name, objects, problems rendering them) for each variant of ``folder``: as it stands, then with each
    Component in a sub-folder that its kustomization does not already name."""
    docs = load(sorted(folder.glob("*.yaml")))
    kustomization = _one(docs, "Kustomization") or {}
    named = kustomization.get("components", [])
    problems: list[str] = []
    for name in named:
        docs, more = apply_component(docs, folder / name)
        problems += more
    found = [(folder.name + "".join(f" + {name}" for name in named), docs, problems)]
    for sub in sorted(p.parent for p in folder.glob("*/kustomization.yaml")):
        if sub.name not in named:
            rendered, more = apply_component(docs, sub)
            found.append((f"{found[0][0]} + {sub.name}", rendered, more))
    return found


def schema_problems(docs: list[tuple[Path, dict]]) -> list[str]:
    problems = []
    for path, doc in docs:
        if doc.get("kind") in NOT_IN_SCHEMAS.get(doc.get("apiVersion", ""), set()):
            continue
        for version in VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                where = ".".join(str(p) for p in err.path)
                problems.append(f"{path.name}: {doc.get('kind')} against Kubernetes {version}: {where}: {err.message}")
            except kubernetes_validate.SchemaNotFoundError:
                problems.append(f"{path.name}: no schema for {doc.get('apiVersion')} {doc.get('kind')} in {version}")
    return problems


def _one(docs: list[tuple[Path, dict]], kind: str) -> dict | None:
    found = [doc for _, doc in docs if doc.get("kind") == kind]
    return found[0] if len(found) == 1 else None


def _selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def link_problems(docs: list[tuple[Path, dict]], folder: Path) -> list[str]:
    problems = []
    deployment = _one(docs, "Deployment")
    if deployment is None:
        return ["expected exactly one Deployment"]
    name = deployment["metadata"]["name"]
    pod = deployment["spec"]["template"]
    pod_labels = pod["metadata"].get("labels", {})
    if not _selects(deployment["spec"]["selector"].get("matchLabels", {}), pod_labels):
        problems.append("Deployment selector does not match its own pod labels")
    container = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        http = container.get(probe, {}).get("httpGet")
        if http is None:
            problems.append(f"Deployment has no HTTP {probe}")
        elif http["port"] not in ports and http["port"] not in ports.values():
            problems.append(f"{probe} uses port {http['port']!r}, not a container port")
    paths = {
        probe: container.get(probe, {}).get("httpGet", {}).get("path") for probe in ("readinessProbe", "livenessProbe")
    }
    if paths != {"readinessProbe": "/v2/health/ready", "livenessProbe": "/v2/health/live"}:
        problems.append(f"probes should be /v2/health/ready and /v2/health/live, got {paths}")
    if str(pod["metadata"].get("annotations", {}).get("prometheus.io/port")) != str(ports.get("metrics")):
        problems.append("prometheus.io/port annotation is not the metrics container port")

    service = _one(docs, "Service")
    if service is None or not _selects(service["spec"].get("selector", {}), pod_labels):
        problems.append("the Service does not select the Deployment's pods")
    else:
        for port in service["spec"]["ports"]:
            if port["targetPort"] not in ports and port["targetPort"] not in ports.values():
                problems.append(f"Service port {port['name']} targets {port['targetPort']!r}, not a container port")

    monitor = _one(docs, "PodMonitor")
    if monitor is None or not _selects(monitor["spec"]["selector"].get("matchLabels", {}), pod_labels):
        problems.append("the PodMonitor does not select the Deployment's pods")
    else:
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            if endpoint.get("port") != "metrics" or "metrics" not in ports:
                problems.append(f"PodMonitor scrapes port {endpoint.get('port')!r}, expected the 'metrics' port")

    hpa = _one(docs, "HorizontalPodAutoscaler")
    served = adapter_metric_names(docs)
    if hpa is None:
        problems.append("expected one HorizontalPodAutoscaler")
    else:
        target = hpa["spec"]["scaleTargetRef"]
        if (target["kind"], target["name"]) != ("Deployment", name):
            problems.append(f"HPA scales {target['kind']}/{target['name']}, not Deployment/{name}")
        for metric in hpa["spec"]["metrics"]:
            if metric["type"] == "Pods" and metric["pods"]["metric"]["name"] not in served:
                problems.append(f"HPA metric {metric['pods']['metric']['name']} is not served by the adapter rules")

    kustomization = _one(docs, "Kustomization")
    if kustomization is not None:
        for resource in kustomization.get("resources", []):
            if not (folder / resource).is_file():
                problems.append(f"kustomization lists {resource}, which does not exist")
    return problems + launcher_problems(pod["spec"], container)


def launcher_problems(pod_spec: dict, container: dict) -> list[str]:
    """The images' entrypoint is the launcher (``python -m serving``): it runs tritonserver behind its HTTP guard
    (whose /v2/health/live notices a dead Python stub), drains on SIGTERM and picks the model configs."""
    problems = []
    args = [str(a) for a in container.get("args", [])]
    if "command" in container or any("tritonserver" in a for a in args):
        problems.append(
            "the container must run the image's launcher (python -m serving) with launcher flags or ROPESERVE_* "
            f"variables, not tritonserver: command={container.get('command')}, args={args}"
        )
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    flags = dict(a.removeprefix("--").split("=", 1) for a in args if a.startswith("--") and "=" in a)
    exit_timeout = flags.get("exit-timeout", env.get("ROPESERVE_EXIT_TIMEOUT"))
    grace = pod_spec.get("terminationGracePeriodSeconds", 30)
    if exit_timeout is None:
        problems.append("set ROPESERVE_EXIT_TIMEOUT (the launcher's drain) so the grace period can be checked")
    elif not str(exit_timeout).isdigit() or grace <= stop_seconds(int(exit_timeout)):
        problems.append(
            f"terminationGracePeriodSeconds {grace} must exceed the launcher's longest stop, "
            f"{stop_seconds(int(exit_timeout))} s for exit timeout {exit_timeout}"
        )
    config_name = str(flags.get("model-config-name", env.get("ROPESERVE_MODEL_CONFIG_NAME", ""))).lower()
    resources = container.get("resources", {})
    has_gpu = any(GPU_RESOURCE in resources.get(part, {}) for part in ("requests", "limits"))
    if has_gpu and config_name == "cpu":
        problems.append(
            f"the pod reserves {GPU_RESOURCE} but serves configs/cpu.pbtxt (ROPESERVE_MODEL_CONFIG_NAME=cpu)"
        )
    if not has_gpu and config_name != "cpu":
        problems.append(
            f"the pod has no {GPU_RESOURCE} but would serve config.pbtxt (KIND_GPU): "
            "set ROPESERVE_MODEL_CONFIG_NAME=cpu"
        )
    return problems


def adapter_rules(docs: list[tuple[Path, dict]]) -> list[dict]:
    """The prometheus-adapter rules held in ConfigMaps (``data.config.yaml``)."""
    rules = []
    for _, doc in docs:
        if doc.get("kind") == "ConfigMap" and "config.yaml" in doc.get("data", {}):
            rules += yaml.safe_load(doc["data"]["config.yaml"]).get("rules", [])
    return rules


def adapter_metric_names(docs: list[tuple[Path, dict]]) -> set[str]:
    return {rule["name"]["as"] for rule in adapter_rules(docs) if "as" in rule.get("name", {})}


def check(name: str, docs: list[tuple[Path, dict]], folder: Path, problems: list[str]) -> bool:
    """Print one ``ok`` line, or one ``FAIL`` line per problem; True when all is well."""
    problems = problems + schema_problems(docs) + link_problems(docs, folder)
    for problem in problems:
        print(f"FAIL {name}: {problem}")
    if not problems:
        kinds = ", ".join(sorted({str(doc.get("kind")) for _, doc in docs}))
        print(f"ok: {name}: {len(docs)} objects ({kinds}); schemas of Kubernetes {', '.join(VERSIONS)}")
    return not problems


def main(argv: list[str] | None = None) -> int:
    args = [Path(a) for a in (sys.argv[1:] if argv is None else argv)] or [K8S_DIR]
    if len(args) == 1 and args[0].is_dir():
        results = [check(name, docs, args[0], problems) for name, docs, problems in variants(args[0])]
    else:
        results = [check(", ".join(p.name for p in args), load(args), args[0].parent, [])]
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
