"""A private Docker engine for the compose test: started here, stopped by PID, every host change undone.

``dockerd`` (Debian's docker.io) runs as root with its own socket, exec root and data root, and starts its own
containerd. While it runs it turns on ``net.ipv4.ip_forward``, adds ``DOCKER*`` iptables chains and creates the
``docker0`` bridge; :meth:`DockerEngine.stop` puts each back as it found it. The data root (images, build cache)
is kept between runs on purpose: a warm compose test reuses the base image and the built layers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
DEFAULT_ROOT = Path(os.environ.get("ROPESERVE_DOCKER_ROOT", "/var/lib/ropeserve-compose"))
APT_PACKAGES = ["docker.io", "iptables", "mmdebstrap", "docker-compose"]
MISSING_HINT = (
    "the compose test needs a Docker engine, iptables, mmdebstrap and docker-compose: "
    "apt-get install -y --no-install-recommends " + " ".join(APT_PACKAGES) + " (.ci/run does this)"
)


class EngineError(RuntimeError):
    """The engine could not be started, or the host could not be put back as it was."""


def missing_tools() -> list[str]:
    return [
        tool for tool in ("dockerd", "iptables-save", "iptables-restore", "docker-compose") if not shutil.which(tool)
    ]


def run(*command: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                if text.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
    return found


@dataclass
class HostState:
    """What dockerd changes on the host, read before it starts."""

    ip_forward: str
    iptables: str
    links: set[str] = field(default_factory=set)

    @classmethod
    def read(cls) -> HostState:
        dump = run("iptables-save")
        if dump.returncode != 0:
            raise EngineError(f"iptables-save failed: {dump.stderr.strip()}")
        return cls(IP_FORWARD.read_text().strip(), dump.stdout, set(os.listdir("/sys/class/net")))

    def restore(self) -> list[str]:
        """Put the host back; return what could not be restored (empty when all is well)."""
        problems = []
        restored = run("iptables-restore", input=restore_input(self.iptables, HostState.read().iptables))
        if restored.returncode != 0:
            problems.append(f"iptables-restore failed: {restored.stderr.strip()}")
        IP_FORWARD.write_text(self.ip_forward + "\n")
        for link in set(os.listdir("/sys/class/net")) - self.links:
            # what the engine creates (docker_gwbridge: swarm mode), nothing else
            if link in ("docker0", "docker_gwbridge") or link.startswith(("br-", "veth")):
                run("ip", "link", "delete", link)
        after = HostState.read()
        if _rules(after.iptables) != _rules(self.iptables):
            problems.append("iptables rules differ from before the engine started")
        if after.ip_forward != self.ip_forward:
            problems.append(f"ip_forward is {after.ip_forward}, was {self.ip_forward}")
        if after.links - self.links:
            problems.append(f"network links left behind: {sorted(after.links - self.links)}")
        return problems


BUILTIN_CHAINS = {
    "filter": ["INPUT", "FORWARD", "OUTPUT"],
    "nat": ["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
    "mangle": ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
    "raw": ["PREROUTING", "OUTPUT"],
}


def _tables(dump: str) -> set[str]:
    return {line[1:].strip() for line in dump.splitlines() if line.startswith("*")}


def restore_input(before: str, now: str) -> str:
    """iptables-restore input that brings ``now`` back to ``before``.

    iptables-restore replaces only the tables its input names, so a table that was empty before (iptables-save
    then prints nothing for it) is written out as its built-in chains, accepting, with no rules.
    """
    blank = [
        "\n".join([f"*{table}", *(f":{chain} ACCEPT [0:0]" for chain in BUILTIN_CHAINS.get(table, [])), "COMMIT"])
        for table in sorted(_tables(now) - _tables(before))
    ]
    return before + "\n".join(blank) + "\n"


def _rules(dump: str) -> set[str]:
    """What the rules mean: no comments, counters, or empty tables (a table with no rules equals none)."""
    table, rules = "", set()
    for line in dump.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":"):
            chain, policy = line[1:].split()[:2]
            if not (chain in BUILTIN_CHAINS.get(table, []) and policy == "ACCEPT"):
                rules.add(f"{table} :{chain} {policy}")
        elif line.startswith("-"):
            rules.add(f"{table} {line}")
    return rules


class DockerEngine:
    """``with DockerEngine() as engine: subprocess.run([...], env=engine.env)``."""

    def __init__(self, root: Path = DEFAULT_ROOT) -> None:
        self.root = root
        self.run_dir = Path("/run/ropeserve-compose")
        self.socket = self.run_dir / "docker.sock"
        self.process: subprocess.Popen | None = None
        self.host_state: HostState | None = None
        self.log_path = self.root / "dockerd.log"

    @property
    def env(self) -> dict[str, str]:
        """The caller's environment, pointed at this engine; BuildKit off (it would fetch its syntax images)."""
        return {
            **os.environ,
            "DOCKER_HOST": f"unix://{self.socket}",
            "DOCKER_BUILDKIT": "0",
            "COMPOSE_DOCKER_CLI_BUILD": "0",
        }

    def start(self, timeout_s: float = 60) -> DockerEngine:
        if missing := missing_tools():
            raise EngineError(f"missing {', '.join(missing)}; {MISSING_HINT}")
        if self.socket.exists():
            raise EngineError(f"{self.socket} exists: another compose test engine is running (or was killed)")
        self.host_state = HostState.read()
        self.root.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        command = [
            "dockerd",
            f"--data-root={self.root / 'docker'}",
            f"--exec-root={self.run_dir / 'exec'}",
            f"--pidfile={self.run_dir / 'dockerd.pid'}",
            f"--host=unix://{self.socket}",
            "--storage-driver=overlay2",
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while run("docker", "version", env=self.env).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise EngineError(f"dockerd did not start; its log:\n{self.log_tail()}")
            time.sleep(0.5)
        return self

    def stop(self) -> list[str]:
        """Stop the engine by PID (SIGTERM, then SIGKILL its process group), undo its host changes.

        Returns the problems found while putting the host back (empty when all is well)."""
        problems: list[str] = []
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    problems.append("dockerd ignored SIGTERM for 30 s; killed")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)  # its containerd, if it survived
            self.process.wait()
            self.process = None
            # container shims start sessions of their own: find them by the exec root in their command line
            if stragglers := processes_mentioning(str(self.run_dir)):
                problems.append(f"processes outlived the engine (killed): {stragglers}")
                for pid in stragglers:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        if self.host_state is not None:
            problems += self.host_state.restore()
            self.host_state = None
        shutil.rmtree(self.run_dir, ignore_errors=True)
        return problems

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def __enter__(self) -> DockerEngine:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


BASE_IMAGE = "ropeserve-base:bookworm-py311-cc"  # a new tag when BASE_PACKAGES changes
PROMETHEUS_IMAGE = "ropeserve-base:prometheus"
# What the CPU image needs of its base, as python:3.11-slim-bookworm has it (the stub embeds libpython3.11), and a
# C compiler for the secret-args stage (python:3.11-slim gets it from apt there; no apt mirror is reachable from
# containers here).
BASE_PACKAGES = "python3.11,libpython3.11,python3.11-venv,ca-certificates,gcc,libc6-dev"


def image_exists(engine: DockerEngine, image: str) -> bool:
    return run("docker", "image", "inspect", image, env=engine.env).returncode == 0


def ensure_base_images(engine: DockerEngine, dockerfiles: Path) -> None:
    """Stand-ins for python:3.11-slim-bookworm and prom/prometheus, built from Debian's packages.

    No image registry is reachable here: the base is a minimal Debian (mmdebstrap, from the host's apt sources)
    imported into the engine; Prometheus is Debian's package on top of it. Both stay in the engine's data root.
    """
    if not image_exists(engine, BASE_IMAGE):
        tarball = engine.root / "base.tar"
        command = ["mmdebstrap", "--mode=root", "--variant=minbase", f"--include={BASE_PACKAGES}", "--format=tar"]
        built = run(*command, "bookworm", str(tarball), timeout=900)
        if built.returncode != 0:
            raise EngineError(f"mmdebstrap failed:\n{built.stderr[-3000:]}")
        imported = run("docker", "import", str(tarball), BASE_IMAGE, env=engine.env, timeout=300)
        tarball.unlink()
        if imported.returncode != 0:
            raise EngineError(f"docker import failed: {imported.stderr}")
    if not image_exists(engine, PROMETHEUS_IMAGE):
        built = run(
            "docker", "build", "-t", PROMETHEUS_IMAGE, "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
            "-f", str(dockerfiles / "prometheus.Dockerfile"), str(dockerfiles), env=engine.env, timeout=900,
        )  # fmt: skip
        if built.returncode != 0:
            raise EngineError(f"building {PROMETHEUS_IMAGE} failed:\n{built.stdout[-3000:]}{built.stderr[-2000:]}")


def leftovers(engine: DockerEngine) -> dict[str, list[str]]:
    """Containers, networks and volumes of the engine that a clean stop would not leave behind."""

    def names(*command: str) -> list[str]:
        return run("docker", *command, env=engine.env, timeout=120).stdout.split()

    found = {
        "containers": names("ps", "-aq"),
        "networks": [n for n in names("network", "ls", "--format", "{{.Name}}") if n not in ("bridge", "host", "none")],
        "volumes": names("volume", "ls", "-q"),
    }
    return {kind: found_names for kind, found_names in found.items() if found_names}


def remove_leftovers(engine: DockerEngine) -> None:
    """What a killed run left in the engine (its data root is ours to clean): swarm state included."""
    if run("docker", "info", "--format", "{{.Swarm.LocalNodeState}}", env=engine.env).stdout.strip() != "inactive":
        run("docker", "swarm", "leave", "--force", env=engine.env, timeout=120)
    if left := leftovers(engine):
        print(f"removing what a killed run left in the engine: {left}")
        run("docker", "rm", "-f", *left.get("containers", []), env=engine.env, timeout=120)
        run("docker", "network", "rm", *left.get("networks", []), env=engine.env, timeout=120)
        run("docker", "volume", "prune", "-f", env=engine.env, timeout=120)


def run_facts(root: Path) -> dict[str, str]:
    """Which code ran on which machine: the commit, the day (UTC) and the cores with the widest vector ISA."""
    commit = run("git", "-C", str(root), "rev-parse", "--short", "HEAD").stdout.strip() or "unknown"
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[-1].split("\n", 1)[0].split()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return {"commit": commit, "date": time.strftime("%Y-%m-%d", time.gmtime()), "cpu": f"{os.cpu_count()} cores, {isa}"}
