# Two commands do everything on a fresh clone: `make serve` and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
SEQSERVE := $(VENV)/bin/seqserve
ARTIFACTS ?= artifacts
CHECKPOINT ?= $(ARTIFACTS)/default
BUNDLE ?= $(ARTIFACTS)/bundle
GRPC_PORT ?= 50051
METRICS_PORT ?= 50052
PYTEST_ARGS ?=
# Intra-op threads of torch and onnxruntime for train, verify, serve and test. Unset: train, verify and serve use
# one per core, tests use 1. On a machine busy with other work, THREADS=1 keeps them from oversubscribing the cores.
THREADS ?=
THREADS_FLAG := $(if $(THREADS),--threads $(THREADS))
# Minutes of training at most (`seqserve train --max-minutes`): it keeps the best checkpoint so far. Unset: the
# preset's full run, which takes hours on a busy machine (README "Two commands").
TRAIN_MINUTES ?=
TRAIN_MINUTES_FLAG := $(if $(TRAIN_MINUTES),--max-minutes $(TRAIN_MINUTES))
# torch's pool size where a command has no flag for it (export; verify's PyTorch half)
THREADS_ENV := $(if $(THREADS),OMP_NUM_THREADS=$(THREADS))

# A recipe that fails deletes the target it was making, so a half-written file never counts as done.
.DELETE_ON_ERROR:
.PHONY: venv test serve train export verify protos clean gpu-check

# The venv is rebuilt whenever pyproject.toml changes. pip prints each package it fetches (no -q): the first
# install takes minutes and should not look stuck.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@echo "Installing seqserve and its extras into $(VENV) (torch, onnxruntime, transformers: a few minutes)"
	$(PY) -m pip install --upgrade --progress-bar on pip
	$(PY) -m pip install --progress-bar on -e '.[train,loadtest,bench,hf,dev]'
	touch $@

venv: $(VENV)/.installed

test: venv
	$(if $(THREADS),SEQSERVE_TEST_THREADS=$(THREADS)) $(PY) -m pytest $(PYTEST_ARGS)

# metrics.json is the last file training writes (model.safetensors just before it, both atomically): a run that
# crashes or is killed leaves no target, and the next `make` trains again.
$(CHECKPOINT)/metrics.json: | venv
	$(THREADS_ENV) $(SEQSERVE) train --preset default --out $(CHECKPOINT) $(TRAIN_MINUTES_FLAG) $(THREADS_FLAG)

$(BUNDLE)/manifest.json: $(CHECKPOINT)/metrics.json
	$(THREADS_ENV) $(SEQSERVE) export $(CHECKPOINT) --out $(BUNDLE) --int8 --fp16

# verify writes verified.json only when every check passed (and removes it otherwise): nothing unverified is served.
$(BUNDLE)/verified.json: $(BUNDLE)/manifest.json
	$(THREADS_ENV) $(SEQSERVE) verify $(BUNDLE) --checkpoint $(CHECKPOINT) $(THREADS_FLAG)

train: $(CHECKPOINT)/metrics.json
export: $(BUNDLE)/manifest.json
verify: $(BUNDLE)/verified.json

serve: venv $(BUNDLE)/verified.json
	$(SEQSERVE) serve --bundle $(BUNDLE) --port $(GRPC_PORT) --metrics-port $(METRICS_PORT) \
		$(if $(THREADS),--intra-op-threads $(THREADS))

# Regenerates the committed gRPC stubs from protos/ (tests/server/test_stubs.py fails when they are stale).
protos: venv
	$(PY) -m seqserve.protogen

# The GPU figures checked with one command (docs/benchmarks.md "GPU check"): the CUDA test suite, the bench rows with
# transformers' generate, and the step profile, into one markdown report. DEVICE=cpu runs the same steps on the CPU;
# GPU_CHECK_QUICK=1 runs them at tiny sizes. PY=python3 on the command line uses that interpreter instead of the venv.
DEVICE ?= cuda
GPU_CHECK_REPORT ?= reports/gpu-check.md
GPU_CHECK_QUICK ?=
gpu-check: $(if $(filter command line,$(origin PY)),,venv)
	$(PY) -m seqserve.loadtest.gpu_check --device $(DEVICE) --out $(GPU_CHECK_REPORT) $(if $(GPU_CHECK_QUICK),--quick)

clean:
	rm -rf $(VENV) $(ARTIFACTS) .pytest_cache
