"""docker-compose.yml: valid for every profile combination (Debian's docker-compose 1.29), and everything it mounts
or builds from exists. No Docker engine is needed (or present): `docker-compose config` only parses and resolves."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
PROFILES = [[], ["cpu"], ["gpu", "loadtest"], ["cpu", "loadtest"]]
INSTALL_HINT = (
    "docker-compose is not installed. On Debian/Ubuntu: "
    "`apt-get update && apt-get install -y --no-install-recommends docker-compose` (.ci/run does this)."
)


def compose(*args: str, cwd: Path = ROOT, compose_file: Path = COMPOSE_FILE) -> subprocess.CompletedProcess:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.fail(INSTALL_HINT)
    return subprocess.run(
        [binary, "-f", str(compose_file), *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("profiles", PROFILES, ids=lambda p: "+".join(p) or "default")
def test_compose_config_is_valid_for_each_profile(profiles):
    flags = [arg for p in profiles for arg in ("--profile", p)]
    result = compose(*flags, "config")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert {"triton-gpu", "triton-cpu", "prometheus", "grafana", "locust"} <= set(resolved["services"])


def test_compose_config_rejects_a_broken_file(tmp_path):
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace("  prometheus:\n", "  prometheus:\n    shm_sise: 1g\n", 1))
    result = compose("config", "--quiet", cwd=tmp_path, compose_file=broken)
    assert result.returncode != 0 and "shm_sise" in result.stderr


def resolved_services() -> dict:
    result = compose("config")
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["services"]


def published_ports(service: dict) -> set[int]:
    return {int(p["published"] if isinstance(p, dict) else str(p).split(":")[-2]) for p in service.get("ports", [])}


def test_services_publish_only_what_a_user_needs_on_loopback():
    services = resolved_services()
    for name in ("triton-gpu", "triton-cpu"):
        assert published_ports(services[name]) == {8001}, name  # HTTP only through nginx's size limit
        assert all(str(p).startswith("127.0.0.1:") for p in services[name]["ports"]), services[name]["ports"]
    assert published_ports(services["http"]) == {8000}
    assert published_ports(services["grafana"]) == {3000}
    assert not services["prometheus"].get("ports") and not services["locust"].get("ports")


def test_gpu_and_cpu_variants_and_health_and_scrape_wiring():
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    services = raw["services"]
    gpu, cpu = services["triton-gpu"], services["triton-cpu"]
    assert gpu["profiles"] == ["gpu"] and cpu["profiles"] == ["cpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert "deploy" not in cpu
    assert "--model-config-name=cpu" in cpu["command"]
    assert not any(arg.startswith("--model-config-name") for arg in gpu["command"])
    for service in (gpu, cpu):
        assert service["shm_size"] and "/v2/health/ready" in " ".join(service["healthcheck"]["test"])
        assert "triton" in service["networks"]["default"]["aliases"]
        assert "8002" in [str(p) for p in service["expose"]]
    assert (ROOT / ".env").read_text().count("COMPOSE_PROFILES=gpu") == 1
    prometheus = yaml.safe_load((ROOT / "serving" / "prometheus" / "prometheus.yml").read_text())
    assert prometheus["scrape_configs"][0]["static_configs"][0]["targets"] == ["triton:8002"]
    assert services["locust"]["profiles"] == ["loadtest"]
    assert "http://triton:8000" in services["locust"]["command"]


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
    services = resolved_services()
    patterns = dockerignore_patterns()
    checked = []
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            if source.startswith("/"):  # a bind mount (named volumes have no slash)
                assert Path(source).exists(), f"{name} mounts {source}, which does not exist"
                checked.append(source)
        build = service.get("build")
        if build:
            context = Path(build["context"])
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            assert dockerfile.is_file(), f"{name} builds from {dockerfile}, which does not exist"
            sources = dockerfile_sources(dockerfile)
            assert sources, dockerfile
            for source in sources:
                assert (context / source).exists(), f"{dockerfile.name} copies {source}, which does not exist"
                assert not ignored(source.rstrip("/"), patterns), f"{source} is excluded by .dockerignore"
                checked.append(source)
    assert len(checked) >= 10
    # the Triton image: NGC 24.10 (= Triton 2.51, as embedded), numpy < 2, the front-model code, no torch
    triton_dockerfile = (ROOT / "serving" / "Dockerfile").read_text()
    final_stage = "\n".join(
        line for line in triton_dockerfile.split("FROM ${TRITON_IMAGE}")[1].splitlines() if not line.startswith("#")
    )
    assert "ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3" in triton_dockerfile
    assert '"numpy>=1.26,<2"' in final_stage and "tokenizers==" in final_stage and "torch" not in final_stage
    assert "python -m export.build_repository" in triton_dockerfile


def test_http_goes_through_nginx_with_the_guard_s_body_limit():
    """Triton 2.51 crashes on HTTP JSON over ~4 MB; nginx must refuse bodies above the launcher guard's limit."""
    from serving.http_guard import DEFAULT_MAX_JSON_BYTES

    config = (ROOT / "serving" / "nginx" / "nginx.conf").read_text()
    limit = re.search(r"client_max_body_size\s+(\d+)m;", config)
    assert limit and int(limit.group(1)) << 20 == DEFAULT_MAX_JSON_BYTES
    assert "server triton:8000" in config and "listen 8000" in config
    mounts = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["http"]["volumes"]
    assert "./serving/nginx/nginx.conf:/etc/nginx/nginx.conf:ro" in mounts
