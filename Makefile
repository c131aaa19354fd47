# One-command entry points. `make serve` and `make test` set up .venv themselves.
PYTHON_SYS ?= python3.11
VENV       := .venv
PY         := $(VENV)/bin/python
NGC_ORT    := .cache/ort-ngc
# ONNX Runtime inside nvcr.io/nvidia/tritonserver:24.10-py3; our ONNX files must load in it too.
NGC_ORT_VERSION := 1.19.2
DATA_DIR   ?= ../shared/data

.PHONY: help venv repository serve test lint train-sentiment clean

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

repository: venv  ## export the committed checkpoints to ONNX into model_repository/
	$(PY) -m export.build_repository

serve: repository  ## start Triton on 127.0.0.1 (HTTP 8000, gRPC 8001, metrics 8002); Ctrl-C stops it
	$(PY) -m serving

lint: venv  ## ruff
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: venv $(NGC_ORT)/.installed repository lint  ## lint + the whole test suite (starts real Triton servers)
	$(PY) -m pytest -q

train-sentiment: venv  ## train the sentiment model (≤ 30 min on 2 cores) into checkpoints/sentiment
	$(PY) -m export.train sentiment --data-dir $(DATA_DIR) --minutes 26 --epochs 6

clean:  ## remove built ONNX files and caches (keeps .venv)
	rm -rf model_repository/*/1/*.onnx model_repository/*/1/tokenizer.json model_repository/*/1/config.json \
	       model_repository/.built.json .pytest_cache .ruff_cache
