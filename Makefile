# Two commands do everything on a fresh clone: `make serve` and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
SEQSERVE := $(VENV)/bin/seqserve
ARTIFACTS ?= artifacts
CHECKPOINT ?= $(ARTIFACTS)/default
BUNDLE ?= $(ARTIFACTS)/bundle
GRPC_PORT ?= 50051
METRICS_PORT ?= 9090
PYTEST_ARGS ?=

.PHONY: venv test serve train export verify protos clean

# The venv is rebuilt whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[train,loadtest,bench,dev]'
	touch $@

venv: $(VENV)/.installed

test: venv
	$(PY) -m pytest $(PYTEST_ARGS)

$(CHECKPOINT)/model.safetensors: | venv
	$(SEQSERVE) train --preset default --out $(CHECKPOINT)

$(BUNDLE)/manifest.json: $(CHECKPOINT)/model.safetensors
	$(SEQSERVE) export $(CHECKPOINT) --out $(BUNDLE) --int8 --fp16
	$(SEQSERVE) verify $(BUNDLE) --checkpoint $(CHECKPOINT)

train: $(CHECKPOINT)/model.safetensors
export: $(BUNDLE)/manifest.json
verify: venv
	$(SEQSERVE) verify $(BUNDLE) --checkpoint $(CHECKPOINT)

serve: venv $(BUNDLE)/manifest.json
	$(SEQSERVE) serve --bundle $(BUNDLE) --port $(GRPC_PORT) --metrics-port $(METRICS_PORT)

# Regenerates the committed gRPC stubs from protos/ (tests/server/test_stubs.py fails when they are stale).
protos: venv
	$(PY) -m seqserve.protogen

clean:
	rm -rf $(VENV) $(ARTIFACTS) .pytest_cache
