# One-command entry points. `make serve` and `make test` set up .venv themselves.
PYTHON_SYS ?= python3.11
VENV       := .venv
PY         := $(VENV)/bin/python
NGC_ORT    := .cache/ort-ngc
# ONNX Runtime inside nvcr.io/nvidia/tritonserver:24.10-py3; our ONNX files must load in it too.
NGC_ORT_VERSION := 1.19.2
# The real perf_analyzer ships in the tritonclient 2.51.0 wheel (2.73 installs a placeholder): its own venv.
PERF_ANALYZER := .cache/perf-analyzer
DATA_DIR   ?= ../shared/data

.PHONY: help venv repository serve test test-tools test-unit test-fast lint train-sentiment clean loadtest compose-config compose-test swarm-test \
        wheelhouse kubernetes-validate perf-analyzer bench

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 20

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -e ".[dev]"
	@touch $@

venv: $(VENV)/.installed  ## create .venv with the pinned dependencies

$(NGC_ORT)/.installed:
	@test -x $(NGC_ORT)/bin/python || $(PYTHON_SYS) -m venv $(NGC_ORT)
	$(NGC_ORT)/bin/python -m pip install --quiet "onnxruntime==$(NGC_ORT_VERSION)" "numpy<2"
	@touch $@

$(PERF_ANALYZER)/.installed:
	@test -x $(PERF_ANALYZER)/bin/python || $(PYTHON_SYS) -m venv $(PERF_ANALYZER)
	$(PERF_ANALYZER)/bin/python -m pip install --quiet --no-deps "tritonclient==2.51.0"
	@touch $@

perf-analyzer: $(PERF_ANALYZER)/.installed  ## install the real perf_analyzer (tritonclient 2.51.0 wheel) into .cache

repository: venv  ## generate the Triton configs from tasks/*.toml, export the checkpoints to ONNX into model_repository/
	$(PY) -m tasks generate
	$(PY) -m export.build_repository

serve: repository  ## start Triton on 127.0.0.1 (HTTP 8000, gRPC 8001, metrics 8002); Ctrl-C stops it
	$(PY) -m serving

lint: venv  ## ruff, the import contracts of pyproject.toml (lint-imports), and mypy (strict: engine, SDK, tasks)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) -m mypy

test-tools:  ## install the Debian tools the tests start (Prometheus, Docker engine, docker-compose, mmdebstrap; root)
	@bash tests/tools.sh

test: test-tools venv $(NGC_ORT)/.installed $(PERF_ANALYZER)/.installed repository lint wheelhouse  ## lint + the whole test suite (real Triton servers, the compose stack and the swarm: root)
	$(PY) -m pytest -q

test-unit: venv $(NGC_ORT)/.installed repository  ## the tests that start no server and export nothing (a few minutes)
	$(PY) -m pytest -q -m "not server and not compose and not export"

test-fast: test-tools venv $(NGC_ORT)/.installed $(PERF_ANALYZER)/.installed repository lint  ## everything but the compose stack and the swarm
	$(PY) -m pytest -q -m "not compose"

train-sentiment: venv  ## train the sentiment model on all five sets into checkpoints/sentiment (~100 min, 2 cores)
	$(PY) -m export.train sentiment --data-dir $(DATA_DIR) --tokenizer words --vocab-size 16000 --d-model 128 \
	  --layers 3 --heads 4 --d-ff 512 --dropout 0.2 --lr 2e-3 --epochs 10 --minutes 100 --pretrain-minutes 60 \
	  --token-dropout 0.1 --negation-templates --mined-negations --distill 0.8 --bf16

.PHONY: ablation
ablation: venv  ## positional-encoding ablation (4 schemes, synthetic tasks) into ablation/; see ABLATION.md
	$(PY) -m export.evaluation.ablation --out ablation

clean:  ## remove built ONNX files and caches (keeps .venv)
	rm -rf model_repository/*/1/*.onnx model_repository/*/1/tokenizer.json model_repository/*/1/config.json \
	       model_repository/*/1/*.toml model_repository/*/1/model.py model_repository/.built.json .pytest_cache .ruff_cache

# ---- operate: load test, deployment checks ----------------------------------------------------------------
HOST              ?= http://127.0.0.1:8000
GRPC_HOST         ?=
USERS             ?= 8
SPAWN_RATE        ?= 0
DURATION          ?= 30s
MIX               ?=
PARAGRAPHS        ?= 0.2
PROTOCOLS         ?= grpc,http
GATEWAY_HOST      ?= http://127.0.0.1:5000
GATEWAY_KEY       ?=
MAX_NEW_TOKENS    ?= 0
NUM_BEAMS         ?= 0
SPLIT_SENTENCES   ?=
MAX_FAILURE_RATIO ?= 0.01
MAX_P99_MS        ?= 10000
RESULTS           ?= loadtest/results
COMPOSE           ?= docker-compose

loadtest: venv  ## locust against a running server (make serve); HOST USERS DURATION MIX PROTOCOLS (grpc,http,gateway) GATEWAY_HOST ...
	$(PY) -m loadtest.run --host "$(HOST)" --grpc-host "$(GRPC_HOST)" --users $(USERS) --spawn-rate $(SPAWN_RATE) \
	  --duration $(DURATION) $(if $(MIX),--mix "$(MIX)") --protocols "$(PROTOCOLS)" --data-dir "$(DATA_DIR)" \
	  --gateway-host "$(GATEWAY_HOST)" $(if $(GATEWAY_KEY),--gateway-key "$(GATEWAY_KEY)") \
	  --paragraphs $(PARAGRAPHS) --max-new-tokens $(MAX_NEW_TOKENS) --num-beams $(NUM_BEAMS) \
	  $(if $(SPLIT_SENTENCES),--split-sentences "$(SPLIT_SENTENCES)") --max-failure-ratio $(MAX_FAILURE_RATIO) \
	  --max-p99-ms $(MAX_P99_MS) --results-dir "$(RESULTS)"

compose-config:  ## validate docker-compose.yml, its Grafana, locust and GPU files (no engine needed)
	$(COMPOSE) -f docker-compose.yml config --quiet
	$(COMPOSE) -f docker-compose.yml -f docker-compose.grafana.yml -f docker-compose.loadtest.yml config --quiet
	$(COMPOSE) -f docker-compose.yml -f docker-compose.gpu.yml -f docker-compose.loadtest.yml config --quiet

compose-test: venv wheelhouse  ## build + start the CPU stack in a private Docker engine, check it, tear it down (root)
	$(PY) -m pytest -q -m compose tests/test_compose_stack.py
	@cat build/compose-test.json
	@echo "to commit it: $(PY) -m benchmarks.compose_table --result build/compose-test.json"

swarm-test: venv wheelhouse  ## the stack on a one-node Docker swarm under load: rolling update, killed replica, scaling (root)
	$(PY) -m pytest -q -m compose tests/test_swarm.py
	@cat build/swarm-test.json
	@echo "to commit it: $(PY) -m benchmarks.swarm_table --result build/swarm-test.json"

# Wheels for the images' pip installs, for hosts whose containers cannot reach PyPI (deploy/wheels/README.md).
WHEEL_TAGS := --only-binary=:all: --python-version 3.11 --platform manylinux_2_35_x86_64 \
              --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
IMAGE_DOCKERFILES := --dockerfile serving/Dockerfile --dockerfile loadtest/Dockerfile
wheelhouse: venv  ## download the wheels the Dockerfiles install into deploy/wheels
	@mkdir -p build
	$(PY) deploy/requirements.py $(IMAGE_DOCKERFILES) > build/wheelhouse.txt
	$(PY) deploy/requirements.py --no-deps $(IMAGE_DOCKERFILES) > build/wheelhouse-no-deps.txt
	$(PY) -m pip download --quiet --dest deploy/wheels $(WHEEL_TAGS) -r build/wheelhouse.txt
	$(PY) -m pip download --quiet --dest deploy/wheels --no-deps $(WHEEL_TAGS) -r build/wheelhouse-no-deps.txt

kubernetes-validate: venv  ## validate deploy/k8s manifests offline (kubernetes-validate, schemas shipped in the wheel)
	$(PY) deploy/validate.py

# ---- benchmarks ------------------------------------------------------------------------------------------
BENCH_ARGS ?=

bench: repository $(PERF_ANALYZER)/.installed  ## every layer vs its baseline → benchmarks/results (BENCH_ARGS=--quick: < 5 min)
	$(PY) -m benchmarks --data-dir "$(DATA_DIR)" $(BENCH_ARGS)

MINUTES ?= 4
.PHONY: soak
soak: repository  ## MINUTES of mixed load, both protocols: memory, throughput, p50 drift → benchmarks/results/soak_<MINUTES>min.json
	$(PY) -m benchmarks.soak --data-dir "$(DATA_DIR)" --minutes $(MINUTES)
