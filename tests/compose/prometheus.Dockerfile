# The compose test's stand-in for prom/prometheus (no registry is reachable here): Debian's Prometheus on the
# locally built base, with the same entry point and data folder as the official image.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends prometheus && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /prometheus && chown nobody:nogroup /prometheus
USER nobody
ENTRYPOINT ["/usr/bin/prometheus"]
