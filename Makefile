# cuforge: the two commands a fresh machine needs.
#   make demo   create or reuse .venv, install cuforge, run the main job
#   make test   create or reuse .venv, install cuforge with its test extras, run ruff and pytest
#   make test-fast   the same without the slow tests (PyTorch extension builds): the edit loop
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test test-fast lint format bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) install -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(PY)
	$(PIP) install -e ".[test]"
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m cuforge.demo

test: $(VENV)/.installed-test
	$(PY) -m ruff check src tests bench
	$(PY) -m ruff format --check src tests bench
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-fast: $(VENV)/.installed-test
	$(PY) -m ruff check src tests bench
	$(PY) -m ruff format --check src tests bench
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

lint: $(VENV)/.installed-test
	$(PY) -m ruff check --fix src tests bench
	$(PY) -m ruff format src tests bench

bench: $(VENV)/.installed-test
	$(PY) bench/compile_cache.py --runs 7

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
