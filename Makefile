# OpenEnv — developer commands. `make demo` and `make test` set everything up on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# pip 26 shows build backends' warnings; setuptools' editable installs of the env packages each
# print an informational 10-line "Editable installation." box. Only that message is silenced.
PIP := PYTHONWARNINGS="ignore:Editable installation.:UserWarning" $(PY) -m pip
# Three installs, each on first use: the demo's (the core and the echo environment: light, no
# torch), the tests' (dev tools and every environment package) and the training examples' (torch
# and the environments they train on: examples/grpo_blackjack imports openspiel_env).
DEMO_STAMP := $(VENV)/.demo-installed
STAMP := $(VENV)/.installed
TRAIN_STAMP := $(VENV)/.train-installed
# torch for the training examples and the TRL adapter, installed first so that nothing else picks
# a build. The default is pinned to the release the development machine keeps a CPU build of; where
# pip sees only PyPI it is a CUDA build of several GB. Pip arguments go here, e.g.
#   make test TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0
# Test processes (pytest-xdist): each runs whole test files, so a file's module fixtures (a Ray
# cluster, a sandbox warden) start once and its tests run in order, as alone. Most of a test waits
# on servers, sandboxes and subprocesses: two processes on two cores halve the run. 0: one process.
TEST_WORKERS ?= 2
# Every environment package of the catalogue (envs/<name>_env), installed editable with its dependencies.
ENVS := $(sort $(patsubst %/pyproject.toml,%,$(wildcard envs/*_env/pyproject.toml)))

.PHONY: setup demo test test-newest lint format bench interop template-interop train-blackjack clean

# compat/openenv-core stands for upstream's distribution name, which upstream's environment
# packages require: without it pip fetches PyPI's openenv-core, written over this core's files.
$(DEMO_STAMP): pyproject.toml envs/echo_env/pyproject.toml compat/openenv-core/pyproject.toml
	bash scripts/install-bubblewrap.sh
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e ".[core]" -e envs/echo_env ./compat/openenv-core
	touch $@

$(TRAIN_STAMP): $(DEMO_STAMP) envs/openspiel_env/pyproject.toml
	$(PIP) install --quiet $(TORCH)
	$(PIP) install --quiet -e ".[core,train]" -e envs/openspiel_env
	touch $@

$(STAMP): $(TRAIN_STAMP) $(addsuffix /pyproject.toml,$(ENVS))
	$(PIP) install --quiet -e ".[core,dev,train,trl,evals,gradio,capture]" $(addprefix -e ,$(ENVS))
	touch $@

setup: $(STAMP)  ## create .venv with the project, its dev tools and every environment package

demo: $(DEMO_STAMP)  ## start the echo environment and run its quick-start against it
	$(PY) examples/echo_demo.py

test: setup  ## lint (ruff, the import layers), then run the test suite
	bash scripts/install-browser.sh
	bash scripts/install-harnesses.sh npm
	$(PY) -m ruff check src tests envs examples bench
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

test-newest:  ## the server tests with the newest uvicorn, websockets, fastmcp, fastapi, starlette (own venv, .venv-newest)
	PYTHON=$(PYTHON) bash scripts/test-newest.sh

lint: setup
	$(PY) -m ruff check src tests envs examples bench
	$(PY) -m ruff format --check src tests envs examples bench

format: setup
	$(PY) -m ruff format src tests envs examples bench
	$(PY) -m ruff check --fix src tests envs examples bench

bench: setup  ## throughput/latency/CPU vs a raw-websockets floor; sync hand-off; footprint; churn; resume; sandbox start-up; Gymnasium vector env vs local; --workers scaling; Ray replica; capture proxy vs a raw engine; fork vs replaying the prefix; the cost of roles; the cost of recording trajectories
	$(PY) bench/bench_ws.py
	$(PY) bench/bench_handoff.py
	$(PY) bench/bench_footprint.py
	$(PY) bench/bench_churn.py
	$(PY) bench/bench_resume.py
	$(PY) bench/bench_sandbox.py
	$(PY) bench/bench_gymnasium.py
	$(PY) bench/bench_scale.py
	$(PY) bench/bench_ray.py
	$(PY) bench/bench_capture.py
	$(PY) bench/bench_fork.py
	$(PY) bench/bench_roles.py
	$(PY) bench/bench_trajectory.py

train-blackjack: $(TRAIN_STAMP)  ## CPU GRPO: a tiny LM learns blackjack through the sandboxed openspiel_env (about 2 min)
	$(PY) examples/grpo_blackjack/train.py

interop: setup  ## drive upstream openenv 0.10.0 with our client and ours with theirs (separate venv)
	bash scripts/interop.sh

template-interop:  ## run the tests of `openenv init`'s packages on upstream openenv 0.10.0 and on ours (downloads upstream)
	bash scripts/template-interop.sh

clean:
	rm -rf $(VENV) .harnesses .venv-newest .venv-verifiers .venv-verifiers.lock build dist src/*.egg-info .pytest_cache .ruff_cache
