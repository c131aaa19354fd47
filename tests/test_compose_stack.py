"""`docker compose up`, for real: the CPU stack is built and started in a private Docker engine, checked, torn down.

What users run is what this runs: docker-compose.yml unchanged, the images built from serving/Dockerfile and
loadtest/Dockerfile. Two stand-ins, because no image registry is reachable here: the Python base image is a
minimal Debian with python3.11 (mmdebstrap), and Prometheus is Debian's package on it (tests/compose). Wheels come
from deploy/wheels (`make wheelhouse`): pip inside a container cannot verify certificates here.

The engine (tests/docker_engine.py) keeps its images and build cache between runs, so a warm run rebuilds
nothing; everything else (containers, networks, volumes, iptables, ip_forward, processes) is undone and checked.
Needs root. The measured times, sizes and memory go to build/compose-test.json (see docs/operate.md).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from docker_engine import (
    BASE_IMAGE,
    PROMETHEUS_IMAGE,
    DockerEngine,
    ensure_base_images,
    leftovers,
    remove_leftovers,
    run,
    run_facts,
)

from clients import Client
from serving.launcher.control import http_status
from serving.launcher.embedded import free_ports

pytestmark = pytest.mark.compose

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "ropeservetest"
REPORT = ROOT / "build" / "compose-test.json"
LOADTEST_FILE = ROOT / "docker-compose.loadtest.yml"
BUILD_TIMEOUT_S = 1800
READY_TIMEOUT_S = 300


@dataclass
class Stack:
    engine: DockerEngine
    env: dict[str, str]
    http_port: int
    grpc_port: int
    prometheus_port: int
    gateway_port: int
    report: dict = field(default_factory=dict)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def compose(self, *args: str, timeout: float = 600) -> object:
        return run("docker-compose", "-p", PROJECT, "-f", str(ROOT / "docker-compose.yml"), *args,
                    env=self.env, cwd=ROOT, timeout=timeout)  # fmt: skip

    def docker(self, *args: str, timeout: float = 120) -> object:
        return run("docker", *args, env=self.env, timeout=timeout)

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()


@pytest.fixture(scope="module")
def stack():
    if os.geteuid() != 0:
        pytest.fail("the compose test runs its own Docker engine and needs root")
    engine = DockerEngine().start()
    stack = None
    try:
        started = time.monotonic()
        ensure_base_images(engine, ROOT / "tests" / "compose")
        http_port, grpc_port, prometheus_port, gateway_port = free_ports(4)
        env = {
            **engine.env,
            "ROPESERVE_BASE_IMAGE": BASE_IMAGE,
            "ROPESERVE_PROMETHEUS_IMAGE": PROMETHEUS_IMAGE,
            "ROPESERVE_HTTP_PORT": str(http_port),
            "ROPESERVE_GRPC_PORT": str(grpc_port),
            "ROPESERVE_PROMETHEUS_PORT": str(prometheus_port),
            "ROPESERVE_GATEWAY_PORT": str(gateway_port),
        }
        stack = Stack(engine, env, http_port, grpc_port, prometheus_port, gateway_port)
        remove_leftovers(engine)
        assert not leftovers(engine), f"the engine could not be cleaned: {leftovers(engine)}"
        stack.report["base_images_s"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        built = stack.compose("-f", str(LOADTEST_FILE), "build", timeout=BUILD_TIMEOUT_S)
        assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
        stack.report["build_s"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        up = stack.compose("up", "-d")
        assert up.returncode == 0, up.stderr
        while http_status(f"{stack.http_url}/v2/health/ready") != 200:
            assert time.monotonic() - started < READY_TIMEOUT_S, stack.compose("logs", "--tail", "60").stdout
            time.sleep(0.5)
        stack.report["up_to_ready_s"] = round(time.monotonic() - started, 1)
        yield stack
    finally:
        problems = []
        if stack is not None:
            stack.compose("-f", str(LOADTEST_FILE), "down", "-v", "--remove-orphans", timeout=180)
            if left := leftovers(engine):
                problems.append(f"left behind: {left}")
            REPORT.parent.mkdir(exist_ok=True)
            REPORT.write_text(json.dumps(stack.report | run_facts(ROOT), indent=2) + "\n")
        problems += engine.stop()
        assert not problems, problems


def test_ready_and_live_through_the_http_front(stack):
    assert http_status(f"{stack.http_url}/v2/health/ready") == 200
    assert http_status(f"{stack.http_url}/v2/health/live") == 200
    health = stack.docker("inspect", "--format", "{{.State.Health.Status}}", stack.container("triton"))
    deadline = time.monotonic() + 60
    while health.stdout.strip() == "starting" and time.monotonic() < deadline:  # the image's HEALTHCHECK
        time.sleep(2)
        health = stack.docker("inspect", "--format", "{{.State.Health.Status}}", stack.container("triton"))
    assert health.stdout.strip() == "healthy"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_endpoint_answers(stack, protocol):
    url = stack.http_url if protocol == "http" else f"127.0.0.1:{stack.grpc_port}"
    with Client(url, protocol=protocol, timeout_s=60) as client:
        verdicts = client.sentiment(["这部电影不差", "服务很差，再也不来了"])
        assert [v.label for v in verdicts] == ["positive", "negative"]
        assert "love" in client.translate("我爱你")[0].lower()
        summary = client.summarize(
            "今天上午，北京市政府召开新闻发布会，宣布将在全市推广垃圾分类，并设立专项资金支持社区。"
        )[0]
        assert summary.strip()


def test_the_gateway_answers_deepl_and_libretranslate_clients(stack):
    import deepl
    from libretranslatepy import LibreTranslateAPI

    url = f"http://127.0.0.1:{stack.gateway_port}"
    deadline = time.monotonic() + 60  # the launcher starts the gateway once Triton is ready
    while http_status(f"{url}/health") != 200:
        assert time.monotonic() < deadline, stack.compose("logs", "--tail", "60").stdout
        time.sleep(0.5)
    translated = deepl.Translator("any", server_url=url).translate_text("我爱你。", target_lang="EN-US").text
    assert "love" in translated.lower()
    assert LibreTranslateAPI(url).translate("我爱你。", "zh", "en") == translated
    with urllib.request.urlopen(f"{url}/", timeout=10) as page:
        assert b"<html" in page.read().lower()


def tritonserver_pids(stack: Stack, container: str) -> list[str]:
    processes = stack.docker("top", container, "-eo", "pid,comm").stdout.splitlines()
    return [line.split()[0] for line in processes if "tritonserver" in line]


def test_an_oversized_body_is_refused_and_triton_lives_on(stack):
    """The request that walked past the old guard and killed Triton 2.51 (8.4 MB, form content type)."""
    container = stack.container("triton")
    servers = tritonserver_pids(stack, container)
    body = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["a" * 8_400_000]}]})
    request = urllib.request.Request(
        f"{stack.http_url}/v2/models/sentiment/infer",
        data=body.encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded", "Inference-Header-Content-Length": "10"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 413
    assert http_status(f"{stack.http_url}/v2/health/ready") == 200
    assert servers and tritonserver_pids(stack, container) == servers  # not restarted


def prometheus_value(stack: Stack, query: str) -> float:
    url = f"http://127.0.0.1:{stack.prometheus_port}/api/v1/query?query={urllib.parse.quote(query)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        result = json.load(response)["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def test_prometheus_in_the_stack_scrapes_triton(stack):
    query = 'sum(nv_inference_request_success{model="sentiment"})'
    before = prometheus_value(stack, query)
    sent = 12
    with Client(stack.http_url, protocol="http", timeout_s=60) as client:
        for _ in range(sent):
            client.sentiment("还行")
    deadline = time.monotonic() + 60
    while (seen := prometheus_value(stack, query)) < before + sent:
        assert time.monotonic() < deadline, f"Prometheus saw {seen - before} of {sent} requests"
        time.sleep(1)
    count = prometheus_value(stack, 'sum(nv_inference_count{model="sentiment"})')
    assert count >= before + sent


def test_the_locust_service_runs_against_the_stack(stack):
    run = stack.compose("-f", str(LOADTEST_FILE), "run", "--rm", "locust", "--host", "http://triton:8000",
                        "--grpc-host", "triton:8001", "--users", "4", "--duration", "20s", "--results-dir",
                        "/tmp/results", "--max-p99-ms", "60000", timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    aggregated = re.search(r"Aggregated\s+(\d+)\s+(\d+)", run.stdout)  # the report's requests and failures
    assert aggregated, run.stdout[-3000:]
    requests, failures = int(aggregated[1]), int(aggregated[2])
    assert requests >= 20 and failures == 0, run.stdout[-3000:]  # 4 users for 20 s against a live stack
    assert "PASS" in run.stdout


def test_dev_shm_is_the_tmpfs_the_compose_file_mounts(stack):
    """docker-compose.yml mounts /dev/shm as a tmpfs (swarm ignores shm_size); Docker's default would be 64 MB."""
    shm = next(v for v in yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["triton"]["volumes"]
               if v["target"] == "/dev/shm")  # fmt: skip
    df = stack.docker("exec", stack.container("triton"), "df", "-B1", "/dev/shm").stdout
    assert int(df.splitlines()[1].split()[1]) == shm["tmpfs"]["size"], df


def test_memory_and_image_sizes_are_recorded(stack):
    stats = stack.docker("stats", "--no-stream", "--format", "{{.Name}}\t{{.MemUsage}}").stdout
    stack.report["memory"] = dict(line.split("\t", 1) for line in stats.splitlines() if "\t" in line)
    for image in ("ropeserve-triton:cpu", "ropeserve-locust:latest", BASE_IMAGE):
        size = stack.docker("image", "inspect", "--format", "{{.Size}}", image).stdout.strip()
        stack.report.setdefault("image_bytes", {})[image] = int(size)
    assert any("triton" in name for name in stack.report["memory"])


def test_compose_down_drains_a_request_in_flight(stack):
    """Last: it stops the stack. Requests still running when the stop begins must be answered."""
    sentence = "我们{}号早上八点在火车站见面，然后一起去北京看长城和故宫，晚上再回来吃饭，第二天去上海。"
    answers: list[dict] = [{} for _ in range(4)]

    def translate(answer: dict, offset: int) -> None:
        # distinct texts (the front model answers repeated ones once); 4 beams over long outputs take seconds
        # each, and the four requests share two cores: small enough to end well inside the client timeout
        texts = [sentence.format(offset + i) * 2 for i in range(16)]
        with Client(stack.http_url, protocol="http", timeout_s=150, retry=None) as client:
            try:
                answer["texts"] = client.translate(texts, num_beams=4, max_new_tokens=64)
            except Exception as error:  # noqa: BLE001 - reported by the assertion below
                answer["error"] = error
            answer["at"] = time.monotonic()

    workers = [threading.Thread(target=translate, args=(a, 100 * i)) for i, a in enumerate(answers)]
    for worker in workers:
        worker.start()
    time.sleep(0.5)
    stop_began = time.monotonic()
    stopped = stack.compose("stop", "-t", "75", "triton", timeout=150)
    for worker in workers:
        worker.join(timeout=150)
    assert stopped.returncode == 0, stopped.stderr
    assert [a.get("error") for a in answers] == [None] * len(answers)
    assert all(len(a["texts"]) == 16 for a in answers)
    in_flight = sum(a["at"] > stop_began for a in answers)
    assert in_flight, "every request finished before the stop began: the test tested nothing"
    stack.report["drain"] = {"requests_in_flight_at_stop": in_flight, "answered": in_flight}
    logs = stack.compose("logs", "--tail", "200", "triton").stdout  # unloading a dozen models logs many lines
    assert "stopping" in logs
