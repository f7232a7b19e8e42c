# Both targets do all set-up on a fresh machine: a .venv with the package in it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: train test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

# The stamp files re-install when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e ".[dev,gym,wandb,ray,mujoco]"
	touch $@ $(VENV)/.installed

train: $(VENV)/.installed
	$(BIN)/ppo-async train --env-id CartPole-v1

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) runs .pytest_cache
