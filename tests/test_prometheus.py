"""A real Prometheus scrapes the embedded server under a short load; PromQL sees the traffic.

Prometheus runs on loopback with the shipped config (serving/prometheus/prometheus.yml), its target and
interval rewritten: scrape every second, a free port, a temporary storage directory. Then:
- rate(nv_inference_count) and the custom generated-token counter are > 0;
- every Grafana dashboard query is valid PromQL and returns data (GPU-only and "> 0"-filtered ones may be empty);
- the Prometheus adapter rule behind the HorizontalPodAutoscaler evaluates to a number.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from dashboard_queries import GPU_ONLY_METRICS, dashboard_queries, metric_names

from serving.launcher.embedded import free_ports

pytestmark = pytest.mark.server  # a real Prometheus scrapes a real server

ROOT = Path(__file__).resolve().parents[1]
INSTALL_HINT = (
    "prometheus is not installed. On Debian/Ubuntu: "
    "`apt-get update && apt-get install -y --no-install-recommends prometheus` (.ci/run does this before `make test`)."
)
WINDOW = "15s"  # what $__rate_interval stands for here (scrape interval 1 s)


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as err:  # a bad query is answered with 400 and an error message
        raise AssertionError(f"Prometheus refused {promql!r}: {err.read().decode()[:300]}") from None
    assert body["status"] == "success", body
    return body["data"]["result"]


def total(base: str, promql: str) -> float:
    return sum(float(r["value"][1]) for r in query(base, promql))


def wait_until(predicate, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"prometheus exited with code {proc.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture
def prometheus(request, tmp_path):
    """A real Prometheus scraping the session's Triton every second; yields (its base URL, the server).

    The server is asked for here, after the check for the binary, not in the test's arguments: pytest sets up
    session fixtures first, and a missing Prometheus should be reported before a server is started."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(INSTALL_HINT)  # before starting any server: say it at once
    triton = request.getfixturevalue("triton")
    config = yaml.safe_load((ROOT / "serving" / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "triton"]
    assert job["static_configs"][0]["targets"] == ["triton:8002"]  # what compose uses
    job["static_configs"][0]["targets"] = [f"127.0.0.1:{triton.options.metrics_port}"]
    gateway = request.getfixturevalue("gateway")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "gateway"]
    assert job["static_configs"][0]["targets"] == ["triton:5000"]  # the gateway's port in the triton container
    job["static_configs"][0]["targets"] = [gateway.url.removeprefix("http://")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    (port,) = free_ports(1)
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: ready(f"{base}/-/ready"), 30, "Prometheus to be ready", proc)
        yield base, triton
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class Load:
    """Sequential requests from two threads until stopped (bounded: at most `max_s` seconds)."""

    def __init__(self, grpc_url: str, max_s: float = 40.0) -> None:
        self.grpc_url, self.max_s = grpc_url, max_s
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.counts = {"sentiment": 0, "translate": 0}
        self.threads = [threading.Thread(target=self.run, args=(m,), daemon=True) for m in self.counts]

    def run(self, model: str) -> None:
        inputs = [grpcclient.InferInput("TEXT", [2, 1], "BYTES")]
        inputs[0].set_data_from_numpy(np.array([["我爱你。".encode()], ["这部电影不差".encode()]], dtype=np.object_))
        if model == "translate":
            for name, value in (("MAX_NEW_TOKENS", 4), ("NUM_BEAMS", 1)):
                tensor = grpcclient.InferInput(name, [2, 1], "INT32")
                tensor.set_data_from_numpy(np.full((2, 1), value, dtype=np.int32))
                inputs.append(tensor)
        deadline = time.monotonic() + self.max_s
        try:
            with grpcclient.InferenceServerClient(self.grpc_url) as client:
                while not self.stop.is_set() and time.monotonic() < deadline:
                    client.infer(model, inputs)
                    self.counts[model] += 1
                    time.sleep(0.02)  # light: the point is a signal, not a benchmark
        except BaseException as err:  # noqa: BLE001 - reported by the test
            self.errors.append(err)

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


def test_prometheus_sees_inference_rate_and_generated_tokens(prometheus):
    prometheus, triton = prometheus
    with Load(triton.grpc_url) as load:
        rate_count = f'sum(rate(nv_inference_count{{model="sentiment"}}[{WINDOW}]))'
        rate_tokens = f'sum(rate(ropeserve_generated_tokens_total{{model="translate"}}[{WINDOW}]))'
        wait_until(
            lambda: total(prometheus, rate_count) > 0 and total(prometheus, rate_tokens) > 0,
            30,
            "rate(nv_inference_count) and rate(ropeserve_generated_tokens_total) > 0 in Prometheus",
        )
        assert total(prometheus, 'up{job="triton"}') == 1
        assert total(prometheus, 'up{job="gateway"}') == 1
        results = {q.expr: query(prometheus, q.expr.replace("$__rate_interval", WINDOW)) for q in dashboard_queries()}
        rules = yaml.safe_load(
            yaml.safe_load((ROOT / "deploy" / "k8s" / "prometheus-adapter-config.yaml").read_text())["data"][
                "config.yaml"
            ]
        )["rules"]
        ratio_query = rules[0]["metricsQuery"].replace("<<.LabelMatchers>>", 'job="triton"')
        ratio = query(prometheus, ratio_query.replace("<<.GroupBy>>", "job"))
    assert not load.errors, load.errors
    assert load.counts["sentiment"] > 0 and load.counts["translate"] > 0

    may_be_empty = {e for e in results if "> 0" in e or metric_names(e) & GPU_ONLY_METRICS}
    empty = {expr for expr, series in results.items() if not series}
    assert empty <= may_be_empty, f"dashboard queries without data under load: {sorted(empty - may_be_empty)}"
    throughput = [q.expr for q in dashboard_queries() if q.expr.startswith("sum by (model) (rate(nv_inference_request")]
    assert any(float(s["value"][1]) > 0 for e in throughput for s in results[e])

    assert len(ratio) == 1 and float(ratio[0]["value"][1]) >= 0  # queue/compute: a number, not NaN or nothing
