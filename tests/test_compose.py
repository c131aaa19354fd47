"""docker-compose.yml without an engine: valid for every profile and with the GPU override (Debian's docker-compose
1.29), secure defaults, and everything it mounts or builds from exists. tests/test_compose_stack.py runs it."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
STACK_FILE = ROOT / "docker-stack.yml"
VARIANTS = {  # the files added to docker-compose.yml
    "default": [],
    "grafana+loadtest": ["docker-compose.grafana.yml", "docker-compose.loadtest.yml"],
    "gpu": ["docker-compose.gpu.yml"],
}
INSTALL_HINT = (
    "docker-compose is not installed. On Debian/Ubuntu: "
    "`apt-get update && apt-get install -y --no-install-recommends docker-compose` (.ci/run does this)."
)


def compose(*args: str, cwd: Path = ROOT, files: list[Path] | None = None, env: dict | None = None):
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.fail(INSTALL_HINT)
    named = [argument for path in (files or [COMPOSE_FILE]) for argument in ("-f", str(path))]
    return subprocess.run(
        [binary, *named, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip


def resolved(variant: str = "default", env: dict | None = None) -> dict:
    result = compose("config", files=[COMPOSE_FILE, *(ROOT / name for name in VARIANTS[variant])], env=env)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["services"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_compose_config_is_valid(variant):
    services = resolved(variant)
    assert {"triton", "prometheus"} <= set(services)


def test_a_plain_up_starts_the_cpu_stack_and_opt_ins_stay_out():
    services = resolved()
    assert set(services) == {"triton", "prometheus"}  # grafana and locust are files of their own
    assert services["triton"]["build"]["target"] == "cpu"
    assert not (ROOT / ".env").exists(), "a .env would change what a plain `docker compose up` does"


def stack_config(*files: Path) -> dict:
    """`docker stack deploy`'s reading of the files, merged (`docker stack config`: no engine needed)."""
    if shutil.which("docker") is None:
        pytest.fail("the docker CLI is not installed: apt-get install -y docker.io (.ci/run does this)")
    named = [argument for path in files for argument in ("-c", str(path))]
    result = subprocess.run(["docker", "stack", "config", *named], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["services"]


def test_swarm_deploys_the_compose_file_with_the_stack_override():
    """`docker stack deploy -c docker-compose.yml [-c docker-stack.yml]`: swarm refuses compose profiles and ignores
    shm_size, so the compose file has neither; the override adds replicas, rollouts and per-replica scraping."""
    plain = stack_config(COMPOSE_FILE)
    assert set(plain) == {"triton", "prometheus"}
    services = stack_config(COMPOSE_FILE, STACK_FILE)
    triton = services["triton"]
    shm = [v for v in triton["volumes"] if v["target"] == "/dev/shm"]
    assert shm and shm[0]["type"] == "tmpfs" and shm[0]["tmpfs"]["size"] >= 2**30
    assert triton["deploy"]["replicas"] == 2
    assert triton["deploy"]["update_config"]["order"] == "start-first"
    assert triton["deploy"]["update_config"]["failure_action"] == "rollback"
    assert triton["stop_grace_period"] == plain["triton"]["stop_grace_period"]  # the drain's time, as in compose
    # Prometheus bind-mounts its config from the checkout: it must run where the deploy ran
    assert services["prometheus"]["deploy"]["placement"]["constraints"] == ["node.role == manager"]
    (config,) = [v for v in services["prometheus"]["volumes"] if v["target"] == "/etc/prometheus/prometheus.yml"]
    swarm = yaml.safe_load(Path(config["source"]).read_text())
    compose_jobs = yaml.safe_load((ROOT / "serving" / "prometheus" / "prometheus.yml").read_text())["scrape_configs"]
    assert [job["job_name"] for job in swarm["scrape_configs"]] == [job["job_name"] for job in compose_jobs]
    for job, compose_job in zip(swarm["scrape_configs"], compose_jobs, strict=True):
        (static,) = compose_job["static_configs"][0]["targets"]
        host, port = static.split(":")
        assert job["dns_sd_configs"] == [{"names": [f"tasks.{host}"], "type": "A", "port": int(port),
                                          "refresh_interval": "5s"}]  # fmt: skip


def test_the_gpu_override_switches_image_target_and_devices_only():
    cpu, gpu = resolved()["triton"], resolved("gpu")["triton"]
    assert gpu["build"]["target"] == "gpu" and gpu["image"] != cpu["image"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert sorted(gpu["ports"]) == sorted(cpu["ports"])


def published(service: dict) -> list[tuple[str, int]]:
    """(host address, host port) of each published port; docker-compose 1.29 writes "ip:host:container/tcp"."""
    ports = []
    for port in service.get("ports", []):
        if isinstance(port, dict):  # Compose v2's long form
            ports.append((port.get("host_ip", "0.0.0.0"), int(port["published"])))
        else:
            host_ip, host_port, _ = str(port).rsplit(":", 2)
            ports.append((host_ip, int(host_port)))
    return ports


def test_ports_are_on_loopback_by_default_and_movable(tmp_path):
    services = resolved("grafana+loadtest")
    assert sorted(published(services["triton"])) == [("127.0.0.1", 5000), ("127.0.0.1", 8000), ("127.0.0.1", 8001)]
    assert published(services["prometheus"]) == [("127.0.0.1", 9090)]
    assert published(services["grafana"]) == [("127.0.0.1", 3000)]
    assert not services["locust"].get("ports")
    moved = resolved(env={"PATH": "/usr/bin:/bin", "ROPESERVE_BIND": "0.0.0.0", "ROPESERVE_HTTP_PORT": "18000"})
    assert published(moved["triton"])[0] == ("0.0.0.0", 18000)


def test_compose_config_rejects_a_broken_file(tmp_path):
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace("  prometheus:\n", "  prometheus:\n    shm_sise: 1g\n", 1))
    result = compose("config", "--quiet", cwd=tmp_path, files=[broken])
    assert result.returncode != 0 and "shm_sise" in result.stderr


def test_the_images_run_the_launcher_with_its_safeguards():
    """One launcher everywhere: both targets start `python -m serving`, whose options the entry point's env sets."""
    from serving.__main__ import build_parser

    text = (ROOT / "serving" / "Dockerfile").read_text()
    stages = dict(re.findall(r"^FROM \S+ AS (\S+)\n(.*?)(?=^FROM |\Z)", text, flags=re.M | re.S))
    for target in ("cpu", "gpu"):
        stage = stages[target]
        assert re.search(r'ENTRYPOINT \["python3?", "-m", "serving"\]', stage), target
        env = dict(re.findall(r"(ROPESERVE_\w+)=(\S+)", stage))
        args = build_parser().parse_args([])  # the defaults read the environment at parse time
        assert args.host == "127.0.0.1" and env["ROPESERVE_HOST"] == "0.0.0.0", target  # containers must listen
        assert env["ROPESERVE_MODEL_REPOSITORY"] == "/models"
    assert stages["cpu"].count("ROPESERVE_MODEL_CONFIG_NAME=cpu") == 1
    assert "ROPESERVE_TRITONSERVER=/opt/tritonserver/bin/tritonserver" in stages["gpu"]
    assert list(stages).index("cpu") < list(stages).index("gpu"), "the classic builder would build the gpu stage"


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(relative: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(relative, p) or relative.startswith(p.rstrip("/") + "/") for p in patterns)


def dockerfile_sources(dockerfile: Path) -> list[str]:
    """Source paths of COPY/ADD instructions that read the build context (not --from=stage)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    sources = []
    for line in text.splitlines():
        words = line.split()
        if words and words[0].upper() in ("COPY", "ADD") and not any(w.startswith("--from") for w in words):
            args = [w for w in words[1:] if not w.startswith("--")]
            sources += args[:-1]
    return sources


def test_every_file_the_compose_file_mounts_or_builds_from_exists():
    services = resolved("grafana+loadtest")
    patterns = dockerignore_patterns()
    checked = []
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.get("source", "") if isinstance(volume, dict) else volume.split(":")[0]  # tmpfs: none
            if source.startswith("/") and "loadtest/data" not in source:  # bind mounts; the data folder is optional
                assert Path(source).exists(), f"{name} mounts {source}, which does not exist"
                checked.append(source)
        build = service.get("build")
        if build:
            context = Path(build["context"])
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            for source in dockerfile_sources(dockerfile):
                assert (context / source).exists(), f"{dockerfile.name} copies {source}, which does not exist"
                assert not ignored(source.rstrip("/"), patterns), f"{source} is excluded by .dockerignore"
                checked.append(source)
    assert len(checked) >= 10


def test_the_images_install_what_pyproject_pins():
    """deploy/requirements.py reads the names of a Dockerfile's pip-install commands, with and without --no-deps,
    and every name the images install has its pin in pyproject.toml."""
    sys.path.insert(0, str(ROOT / "deploy"))
    import requirements

    sample = "RUN /build/pip-install a b \\\n    c && /build/pip-install --no-deps d\nRUN /build/pip-install a e\n"
    assert requirements.dockerfile_names(sample, no_deps=False) == ["a", "b", "c", "e"]
    assert requirements.dockerfile_names(sample, no_deps=True) == ["d"]
    for dockerfile in ("serving/Dockerfile", "loadtest/Dockerfile"):
        text = (ROOT / dockerfile).read_text()
        for no_deps in (False, True):
            names = requirements.dockerfile_names(text, no_deps)
            pins = requirements.requirements(names)  # SystemExit naming every name pyproject.toml does not pin
            assert all(re.search(r"[=<>]", pin) for pin in pins), (dockerfile, pins)
    (numpy,) = requirements.requirements(["numpy"])
    assert not Requirement(numpy).specifier.contains("2.0.0")  # numpy 2 breaks Triton 2.51's stub
    with pytest.raises(SystemExit, match="pins no left-pad"):
        requirements.requirements(["left-pad"])
