"""A real Prometheus scrapes the embedded server under a short load; PromQL sees the traffic.

Prometheus runs on loopback with the shipped config (serving/prometheus/prometheus.yml), its target and
interval rewritten: scrape every second, a free port, a temporary storage directory. Then:
- rate(nv_inference_count) and the custom generated-token counter are > 0;
- every Grafana dashboard query is valid PromQL and returns data (GPU-only and "> 0"-filtered ones may be empty);
- the Prometheus adapter rule behind the HorizontalPodAutoscaler evaluates to a number, rises above the HPA's target
  when any one endpoint is overloaded, and falls back when the load stops.
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
from everyday import SENTENCES

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


class Clients:
    """Client threads (``threads``), started on entering; told to ``stop`` and joined on leaving."""

    threads: list[threading.Thread]
    stop: threading.Event

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


class Load(Clients):
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
        signal = adapter_rule(hpa_target()[0])["metricsQuery"].replace("<<.LabelMatchers>>", 'job="triton"')
        waiting = query(prometheus, signal.replace("<<.GroupBy>>", "job"))
    assert not load.errors, load.errors
    assert load.counts["sentiment"] > 0 and load.counts["translate"] > 0

    may_be_empty = {e for e in results if "> 0" in e or metric_names(e) & GPU_ONLY_METRICS}
    empty = {expr for expr, series in results.items() if not series}
    assert empty <= may_be_empty, f"dashboard queries without data under load: {sorted(empty - may_be_empty)}"
    throughput = [q.expr for q in dashboard_queries() if q.expr.startswith("sum by (model) (rate(nv_inference_request")]
    assert any(float(s["value"][1]) > 0 for e in throughput for s in results[e])

    assert len(waiting) == 1 and float(waiting[0]["value"][1]) >= 0  # the HPA's signal: a number, not NaN or nothing


def adapter_rule(name: str) -> dict:
    """The prometheus-adapter rule serving the custom metric ``name`` (deploy/k8s/prometheus-adapter-config.yaml)."""
    config = yaml.safe_load((ROOT / "deploy" / "k8s" / "prometheus-adapter-config.yaml").read_text())
    rules = yaml.safe_load(config["data"]["config.yaml"])["rules"]
    (rule,) = [rule for rule in rules if rule["name"]["as"] == name]
    return rule


def hpa_target() -> tuple[str, float]:
    """The custom metric the HPA scales on and its target average per pod (deploy/k8s/hpa.yaml)."""
    hpa = yaml.safe_load((ROOT / "deploy" / "k8s" / "hpa.yaml").read_text())
    (metric,) = hpa["spec"]["metrics"]
    value = str(metric["pods"]["target"]["averageValue"])
    return metric["pods"]["metric"]["name"], float(value[:-1]) / 1000 if value.endswith("m") else float(value)


def keda_trigger() -> tuple[str, float]:
    """The Prometheus query and threshold of the KEDA alternative (deploy/k8s/keda/scaledobject.yaml)."""
    scaled = yaml.safe_load((ROOT / "deploy" / "k8s" / "keda" / "scaledobject.yaml").read_text())
    (trigger,) = scaled["spec"]["triggers"]
    return trigger["metadata"]["query"], float(trigger["metadata"]["threshold"])


class Overload(Clients):
    """``clients`` threads sending ``send(client)`` back to back through the SDK until stopped; refusals counted."""

    def __init__(self, url: str, clients: int, send) -> None:
        self.url, self.send = url, send
        self.stop = threading.Event()
        self.answered, self.refused = 0, 0
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(clients)]

    def run(self) -> None:
        from clients import Client, ClientError

        with Client(self.url, retry=None) as client:
            while not self.stop.is_set():
                try:
                    self.send(client)
                    self.answered += 1
                except ClientError:  # a full queue refuses at once: part of overloading it
                    self.refused += 1


PARAGRAPH = "".join(SENTENCES[:8])
OVERLOADS = {  # endpoint: (clients, one request); translate as measured in issue 46: 48 clients, paragraphs, beam 4
    "translate": (48, lambda client: client.translate([PARAGRAPH], num_beams=4)),
    "sentiment": (32, lambda client: client.sentiment([PARAGRAPH] * 16)),
    "translate_stream": (32, lambda client: "".join(client.stream("translate", PARAGRAPH, num_beams=4))),
}


@pytest.mark.parametrize("endpoint", list(OVERLOADS))
def test_the_scaling_signal_rises_when_any_endpoint_is_overloaded_and_falls_when_idle(prometheus, endpoint):
    """What the HPA reads, through the adapter's own query: above its target within 30 s of overloading one
    endpoint, engine-backed or not, and back under within 60 s of idle."""
    prometheus, triton = prometheus
    name, target = hpa_target()
    signal = adapter_rule(name)["metricsQuery"].replace("<<.LabelMatchers>>", 'job="triton"')
    signal = signal.replace("<<.GroupBy>>", "job")
    clients, send = OVERLOADS[endpoint]
    seen: list[tuple[float, float]] = []  # (seconds since the phase began, the signal)

    def seconds_until(predicate, timeout_s: float) -> float | None:
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            seen.append((round(time.monotonic() - started, 1), total(prometheus, signal)))
            if predicate(seen[-1][1]):
                return seen[-1][0]
            time.sleep(1.0)
        return None

    assert seconds_until(lambda v: v < target, 90) is not None, f"{name} not under {target} before the load: {seen}"
    keda, threshold = keda_trigger()
    keda = keda.replace('pod=~"ropeserve-triton-.*"', 'job="triton"')
    with Overload(triton.grpc_url, clients, send) as load:
        rose = seconds_until(lambda v: v > target, 30)
        keda_value = total(prometheus, keda)
    peak = max(v for _, v in seen)
    fell = seconds_until(lambda v: v < target, 60)
    print(
        f"\n{endpoint}, {clients} clients: {name} above {target:g} after {rose} s (peak {peak:.1f}), back under "
        f"{fell} s after the load stopped; {load.answered} answered, {load.refused} refused"
    )
    assert rose is not None, f"{name} stayed under {target} for 30 s of {endpoint} overload: {seen}"
    assert fell is not None, f"{name} still above {target} 60 s after the load stopped: {seen[-10:]}"
    assert keda_value > threshold, f"KEDA's query gave {keda_value} when the adapter's rose above {target}"
    assert load.answered > 0
