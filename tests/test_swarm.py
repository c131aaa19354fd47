"""`docker stack deploy`, for real: the compose stack on a one-node Docker swarm, under load from clients that use
the SDK's retries, through a rolling update, a killed replica and scaling. `make swarm-test`; part of `make test`.

What users run is what this deploys: `docker stack deploy -c docker-compose.yml -c docker-stack.yml`, unchanged,
with the images `docker-compose build` makes (the stand-in base images of tests/test_compose_stack.py). One thing
differs, and the kernel forces it: it has no IPVS (`CONFIG_IP_VS` is not set), which swarm's routing mesh and
virtual IPs need, so the published ports never answer here. The clients run inside the stack's network instead
(`python -m loadtest.rollout` in the locust image) and find the replicas by swarm's DNS, `tasks.triton`, as
Prometheus does.

Phases, in order, with the load running throughout: 2 replicas; a rolling update to a new image tag; one replica's
container killed; scaling 2 -> 1; 1 replica; scaling 1 -> 2. Each phase's requests as the clients saw them (sent,
answered, retried, failed) and the time until the swarm was whole again go to build/swarm-test.json (see
docs/operate.md "Docker swarm"). Teardown leaves no swarm state, container, network, volume, link or iptables rule.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
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

from loadtest.rollout import read, tally
from serving.launcher.embedded import free_ports

pytestmark = pytest.mark.compose

ROOT = Path(__file__).resolve().parents[1]
STACK = "ropeservetest"
SERVICE = f"{STACK}_triton"
IMAGE = "ropeserve-triton:cpu"
NEXT_IMAGE = "ropeserve-triton:swarm-test-next"  # the same build under a new tag: what a release pipeline pushes
LOAD = "ropeservetest-load"
REPORT = ROOT / "build" / "swarm-test.json"
BUILD_TIMEOUT_S = 1800
WHOLE_TIMEOUT_S = 300
STEADY_S = 20
PAUSE_S = 0.1  # between a worker's requests: leaves the CPU room to start a replica (measured: without it, a
# replica starting beside two saturated ones crashed, boost::interprocess::lock_exception)
ROLLOUT = ["--entrypoint", "python", "ropeserve-locust:latest", "-m", "loadtest.rollout",
           "--grpc-host", "tasks.triton:8001", "--host", "http://tasks.triton:8000"]  # fmt: skip


@dataclass
class Swarm:
    engine: DockerEngine
    env: dict[str, str]
    results: Path
    report: dict = field(default_factory=dict)

    def docker(self, *args: str, timeout: float = 120):
        return run("docker", *args, env=self.env, cwd=ROOT, timeout=timeout)

    def containers(self, *filters: str) -> list[str]:
        return self.docker(
            "ps", "-q", "--filter", f"label=com.docker.swarm.service.name={SERVICE}", *filters
        ).stdout.split()

    def is_whole(self, replicas: int) -> bool:
        """Exactly `replicas` replicas running, each past the image's HEALTHCHECK."""
        return len(self.containers()) == replicas == len(self.containers("--filter", "health=healthy"))

    def wait_whole(self, replicas: int, since: float) -> float:
        """Seconds from `since` (time.time()) until the service is whole again."""
        deadline = time.monotonic() + WHOLE_TIMEOUT_S
        while not self.is_whole(replicas):
            assert time.monotonic() < deadline, self.docker("service", "ps", "--no-trunc", SERVICE).stdout
            time.sleep(0.5)
        return round(time.time() - since, 1)

    def addresses(self, container: str) -> list[str]:
        template = "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}"
        return self.docker("inspect", "--format", template, container).stdout.split()

    def requests_per_replica(self, seconds: int) -> dict[str, float]:
        """Each replica's address -> the requests its Triton counted in the last `seconds`."""
        query = f'sum by (instance) (increase(nv_inference_request_success{{job="triton"}}[{seconds}s]))'
        return {share["metric"]["instance"].split(":")[0]: float(share["value"][1]) for share in self.prometheus(query)}

    def prometheus(self, query: str) -> list[dict]:
        """A PromQL query, asked inside the Prometheus container (its published port is the mesh's: no answer)."""
        (container,) = self.docker(
            "ps", "-q", "--filter", f"label=com.docker.swarm.service.name={STACK}_prometheus"
        ).stdout.split()
        url = f"http://127.0.0.1:9090/api/v1/query?query={urllib.parse.quote(query)}"
        code = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())"
        answer = self.docker("exec", container, "python3", "-c", code)
        assert answer.returncode == 0, answer.stderr
        return json.loads(answer.stdout)["data"]["result"]


@pytest.fixture(scope="module")
def swarm():
    if os.geteuid() != 0:
        pytest.fail("the swarm test runs its own Docker engine and needs root")
    engine = DockerEngine().start()
    results = Path(tempfile.mkdtemp(prefix="ropeserve-swarm-"))
    results.chmod(0o777)  # the load container writes its log here
    swarm = None
    try:
        ensure_base_images(engine, ROOT / "tests" / "compose")
        remove_leftovers(engine)
        assert not leftovers(engine), f"the engine could not be cleaned: {leftovers(engine)}"
        # the published ports cannot answer here (no IPVS), but they must not collide with anything either
        ports = dict(zip(("HTTP", "GRPC", "GATEWAY", "PROMETHEUS"), free_ports(4), strict=True))
        env = {**engine.env, "ROPESERVE_BASE_IMAGE": BASE_IMAGE, "ROPESERVE_PROMETHEUS_IMAGE": PROMETHEUS_IMAGE,
               **{f"ROPESERVE_{name}_PORT": str(port) for name, port in ports.items()}}  # fmt: skip
        swarm = Swarm(engine, env, results)
        files = ["-f", "docker-compose.yml", "-f", "docker-compose.loadtest.yml"]
        built = run("docker-compose", *files, "build", env=env, cwd=ROOT, timeout=BUILD_TIMEOUT_S)
        assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
        assert swarm.docker("tag", IMAGE, NEXT_IMAGE).returncode == 0
        joined = swarm.docker("swarm", "init", "--advertise-addr", "127.0.0.1")
        assert joined.returncode == 0, joined.stderr
        started = time.time()
        deployed = swarm.docker("stack", "deploy", "--resolve-image", "never", "-c", "docker-compose.yml", "-c",
                                "docker-stack.yml", STACK)  # fmt: skip
        assert deployed.returncode == 0, deployed.stderr
        swarm.report["deploy_to_whole_s"] = swarm.wait_whole(2, started)
        yield swarm
    finally:
        problems = []
        if swarm is not None:
            swarm.docker("rm", "-f", LOAD)
            swarm.docker("stack", "rm", STACK)
            deadline = time.monotonic() + 150  # each replica drains first (stop_grace_period)
            while swarm.docker("ps", "-aq").stdout.split() and time.monotonic() < deadline:
                time.sleep(1)
            swarm.docker("swarm", "leave", "--force")
            swarm.docker("network", "rm", "docker_gwbridge")  # swarm's bridge outlives the swarm
            swarm.docker("image", "rm", NEXT_IMAGE)
            swarm.docker("volume", "rm", f"{STACK}_prometheus-data")  # `stack rm` keeps named volumes
            if left := leftovers(engine):
                problems.append(f"left behind: {left}")
            if swarm.report:
                REPORT.parent.mkdir(exist_ok=True)
                REPORT.write_text(json.dumps(swarm.report | run_facts(ROOT), indent=2) + "\n")
        problems += engine.stop()
        shutil.rmtree(results, ignore_errors=True)
        assert not problems, problems


def test_prometheus_finds_every_replica(swarm):
    """Both jobs, each replica a target of its own (dns_sd on tasks.triton), every target up."""
    deadline = time.monotonic() + 60  # dns_sd refreshes every 5 s, scrapes every 5 s; the gateway starts last
    while len(swarm.prometheus("up == 1")) < 4:
        assert time.monotonic() < deadline, swarm.prometheus("up")
        time.sleep(1)
    up = swarm.prometheus("up")
    assert sorted(target["metric"]["job"] for target in up) == ["gateway", "gateway", "triton", "triton"], up
    assert len({target["metric"]["instance"].split(":")[0] for target in up}) == 2


def test_rollouts_under_load(swarm):
    """The clients' view of each phase; the bars of issue 46: no failed request in a rolling update or a scale
    change, and a lost replica fails at most the requests it held."""
    log = swarm.results / "requests.jsonl"
    started = swarm.docker(
        "run", "-d", "--name", LOAD, "--network", f"{STACK}_default", "-v", f"{swarm.results}:/results", *ROLLOUT,
        "--log", "/results/requests.jsonl", "--pause", str(PAUSE_S), "--stop-file", "/results/stop",
        "--duration", "30m",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    time.sleep(5)  # the first requests of each worker open connections and warm caches: not a phase
    phases: list[dict] = []

    def phase(name: str, replicas: int, action: Callable[[], object] | None = None) -> None:
        begin = time.time()
        if action is None:
            steady(replicas)
            whole_s = None
        else:
            action()
            whole_s = swarm.wait_whole(replicas, begin)
        phases.append({"name": name, "replicas": replicas, "start": begin, "end": time.time(), "whole_s": whole_s})

    def steady(replicas: int) -> None:
        """The load alone for STEADY_S; each replica's share of it, as Prometheus counted it."""
        time.sleep(STEADY_S)
        shares = swarm.requests_per_replica(STEADY_S)
        swarm.report.setdefault("requests_per_replica", {})[str(replicas)] = sorted(round(n) for n in shares.values())
        assert len(shares) == replicas and all(n > 0 for n in shares.values()), shares

    def update() -> None:
        updated = swarm.docker("service", "update", "--detach=false", "--image", NEXT_IMAGE, SERVICE, timeout=600)
        assert updated.returncode == 0, updated.stderr
        assert "rollback" not in updated.stdout + updated.stderr, updated.stdout  # failure_action: the update failed

    def kill() -> None:
        """The replica that served the most in the last 15 s: the one whose loss clients would notice most."""
        shares = swarm.requests_per_replica(15)
        container = max(swarm.containers(), key=lambda c: max(shares.get(a, 0.0) for a in swarm.addresses(c)))
        killing = time.time()
        assert swarm.docker("kill", container).returncode == 0
        swarm.report["killed"] = (killing, time.time())  # the replica died at some moment in between
        time.sleep(1)  # the swarm notices the exit before it can be whole again

    def scale(replicas: int) -> Callable[[], None]:
        def action() -> None:
            scaled = swarm.docker("service", "scale", "--detach=false", f"{SERVICE}={replicas}", timeout=600)
            assert scaled.returncode == 0, scaled.stderr

        return action

    phase("2 replicas", 2)
    phase("rolling update to a new tag", 2, update)
    phase("a replica killed", 2, kill)
    phase("scaling 2 → 1", 1, scale(1))
    phase("1 replica", 1)
    phase("scaling 1 → 2", 2, scale(2))
    (swarm.results / "stop").touch()
    assert swarm.docker("wait", LOAD, timeout=120).stdout.strip() == "0", swarm.docker("logs", LOAD).stderr[-3000:]

    requests = read(log)
    REPORT.parent.mkdir(exist_ok=True)
    shutil.copyfile(log, REPORT.with_name("swarm-requests.jsonl"))  # each request, for a closer look
    killing, killed = swarm.report.pop("killed")
    held = sum(1 for r in requests if r["start"] <= killed and r["end"] >= killing)  # running as the replica died
    swarm.report["load"] = {"workers": len({(r["endpoint"], r["protocol"]) for r in requests}), "pause_s": PAUSE_S,
                            "endpoints": sorted({r["endpoint"] for r in requests})}  # fmt: skip
    swarm.report["phases"] = [
        {
            "name": p["name"],
            "replicas": p["replicas"],
            "start": round(p["start"], 1),
            "whole_s": p["whole_s"],
            **tally(requests, p["start"], p["end"]),
        }
        for p in phases
    ]
    swarm.report["in_flight_when_killed"] = held
    by_name = {p["name"]: p for p in swarm.report["phases"]}
    for name, counts in by_name.items():
        assert counts["sent"] > 0, f"{name}: no request ran"
        assert counts["answered"] + counts["failed"] == counts["sent"]
        if name != "a replica killed":
            assert counts["failed"] == 0, (name, counts)
    assert by_name["a replica killed"]["failed"] <= held, by_name["a replica killed"]
    assert len(swarm.report["load"]["endpoints"]) == 5  # every endpoint and streaming twin, over gRPC and HTTP
