"""The Grafana dashboard uses only metrics the running server really exports, and is wired to the compose stack."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from dashboard_queries import (
    DASHBOARD_DIR,
    GPU_ONLY_METRICS,
    dashboard_queries,
    exported_metric_names,
    metric_names,
)
from prometheus_text import scrape

ROOT = Path(__file__).resolve().parents[1]
PROVISIONING = ROOT / "serving" / "grafana" / "provisioning"


def test_metric_name_extraction_reads_promql_like_prometheus():
    expr = (
        'sum by (model, le) (rate(ropeserve_batch_size_bucket{model=~"a|b", le!="x"}[$__rate_interval])) '
        "/ on (model) group_left sum without (instance) (nv_inference_exec_count offset 5m) > bool 0"
    )
    assert metric_names(expr) == {"ropeserve_batch_size_bucket", "nv_inference_exec_count"}
    assert metric_names('histogram_quantile(0.9, x_bucket) * 1000 + max(nv_y{quantile="0.5"})') == {"x_bucket", "nv_y"}


def test_every_dashboard_metric_is_exported_by_the_running_server(triton):
    queries = dashboard_queries()
    assert len(queries) >= 15 and {q.dashboard for q in queries} == {"ropeserve.json"}
    used = set().union(*(metric_names(q.expr) for q in queries))
    exported = exported_metric_names(scrape(triton.metrics_url))
    # the panels the issue asks for are there: throughput, latency quantiles, queue vs compute, batch size,
    # generated tokens, failures by reason
    for name in (
        "nv_inference_request_success",
        "nv_inference_request_summary_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_count",
        "nv_inference_exec_count",
        "ropeserve_generated_tokens_total",
        "ropeserve_rejected_requests_total",
        "nv_inference_request_failure",
    ):
        assert name in used, f"no dashboard query uses {name}"
    missing = {
        f"{name} (panel {q.panel!r})"
        for q in queries
        for name in metric_names(q.expr)
        if name not in exported and name not in GPU_ONLY_METRICS
    }
    assert not missing, f"dashboard queries use metrics the server does not export: {sorted(missing)}"
    # the GPU-only names are the only exemption, and they really are absent here (no GPU), not misspelt locals
    assert not (GPU_ONLY_METRICS & exported)
    # ... and every exempted name is one a GPU panel reads: an exemption nothing uses would hide a misspelt query
    assert used & GPU_ONLY_METRICS == GPU_ONLY_METRICS and all(n.startswith("nv_gpu_") for n in GPU_ONLY_METRICS)


def test_dashboard_reads_the_provisioned_datasource_and_is_mounted_where_the_provider_looks():
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())["datasources"]
    uids = {ds["uid"] for ds in datasources}
    assert any(ds["url"] == "http://prometheus:9090" for ds in datasources)
    for path in DASHBOARD_DIR.glob("*.json"):
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] in uids, panel["title"]
            assert all(t["datasource"]["uid"] in uids for t in panel["targets"]), panel["title"]
            assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(ids) == len(set(ids)), "panel ids must be unique"
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "ropeserve.yml").read_text())["providers"][0]
    compose = yaml.safe_load((ROOT / "docker-compose.grafana.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./serving/grafana/dashboards:{provider['options']['path']}:ro" in mounts
    assert "./serving/grafana/provisioning:/etc/grafana/provisioning:ro" in mounts
