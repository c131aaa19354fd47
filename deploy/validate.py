"""Validate the Kubernetes manifests offline: schemas, then the links between the objects.

``python deploy/validate.py [FILES...]`` (``make kubernetes-validate``; default: every manifest in deploy/k8s).

1. Every built-in object is checked strictly (unknown fields are errors) against the OpenAPI schemas that
   ship inside the ``kubernetes-validate`` wheel, for each Kubernetes version in ``VERSIONS``. Nothing is
   fetched: the wheel's ``-local`` schemas resolve their references from disk.
2. Custom resources (the Prometheus Operator's PodMonitor) have no schema there; they and the objects are
   checked against each other instead: the Service and PodMonitor select the Deployment's pods and name
   its ports, probes use declared ports, the HPA scales the Deployment on the metric the Prometheus
   adapter rule serves, and the kustomization lists files that exist.

Exit status 0 when all is well, 1 with one line per problem otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import kubernetes_validate
import yaml

K8S_DIR = Path(__file__).resolve().parent / "k8s"
VERSIONS = ("1.29.0", "1.37.0")
NOT_IN_SCHEMAS = {"monitoring.coreos.com/v1": {"PodMonitor"}, "kustomize.config.k8s.io/v1beta1": {"Kustomization"}}


def load(paths: list[Path]) -> list[tuple[Path, dict]]:
    docs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            docs += [(path, doc) for doc in yaml.safe_load_all(f) if doc]
    return docs


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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    paths = [Path(a) for a in args] or sorted(K8S_DIR.glob("*.yaml"))
    docs = load(paths)
    problems = schema_problems(docs) + link_problems(docs, paths[0].parent if paths else K8S_DIR)
    for problem in problems:
        print(f"FAIL {problem}")
    kinds = ", ".join(sorted({str(doc.get("kind")) for _, doc in docs}))
    if problems:
        return 1
    print(f"ok: {len(docs)} objects ({kinds}) in {len(paths)} files; schemas of Kubernetes {', '.join(VERSIONS)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
