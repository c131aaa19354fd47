#!/usr/bin/env bash
# The Debian tools the tests start for real, installed when missing (`make test` runs this first): Prometheus
# (the metrics tests scrape with it), and for the compose test a Docker engine (docker.io, iptables),
# docker-compose and mmdebstrap (which builds the stand-in base image: no image registry is reachable here).
set -euo pipefail
tools=(prometheus docker-compose dockerd iptables-save mmdebstrap chromium chromedriver)
packages="prometheus docker-compose docker.io iptables mmdebstrap chromium chromium-driver"
missing=()
for tool in "${tools[@]}"; do command -v "$tool" >/dev/null || missing+=("$tool"); done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "tests/tools.sh: the tests need ${missing[*]}, which only root can install here; run once:" >&2
  echo "  sudo apt-get install -y --no-install-recommends $packages" >&2
  echo "(or run the tests that need none of them: make test-unit)" >&2
  exit 1
fi
echo "tests/tools.sh: installing ${missing[*]} (apt-get: $packages)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends: no system services or extras beyond what the tests start themselves
apt-get install -y -qq --no-install-recommends $packages >/dev/null
# packages may start system services where that is allowed; the tests run their own
if command -v service >/dev/null; then
  service prometheus stop >/dev/null 2>&1 || true
  service docker stop >/dev/null 2>&1 || true
  service containerd stop >/dev/null 2>&1 || true
fi
