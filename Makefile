# recperf: `make demo` runs the main job, `make test` runs lint, type check and the test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Every install takes its versions from the lock, a pip constraints file that pip-tools'
# pip-compile writes from pyproject.toml's [dev] extra and requirements/lock.in (`make lock`), so a
# fresh machine installs exactly what CI tested; pyproject.toml's own ranges stay ranges for
# users. No hashes: pip's hash-checking mode refuses the editable install of recperf itself.
# The lock is for CPython 3.11 on x86-64 Linux.
LOCK := requirements/lock.txt
PIP := $(BIN)/pip install --quiet -c $(LOCK)
# `make lock` runs pip-tools from a venv of its own, never from $(VENV);
# `make lock UPGRADE=1` takes the newest releases that the inputs allow.
LOCKTOOLS ?= /tmp/recperf-locktools

.PHONY: demo test check fmt bench clean lock

# torch goes in first, pinned: any other torch request downloads a multi-GB CUDA build. pip takes
# the CPU build (2.13.0+cpu) where it finds one, and the lock's torch==2.13.0 keeps any later step
# from swapping it.
$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev]' fbgemm-gpu-cpu
	# The embedding peers (tests and benchmarks/embed_cpu.py): TorchRec's own requirements would
	# replace torch, so it and its few pure-Python imports go in without dependencies.
	$(PIP) --no-deps torchrec tensordict pyvers pyre-extensions typing-inspect
	touch $(STAMP)

lock: pyproject.toml requirements/lock.in
	test -x $(LOCKTOOLS)/bin/pip-compile || \
		{ $(PYTHON) -m venv $(LOCKTOOLS) && $(LOCKTOOLS)/bin/pip install --quiet pip-tools==7.6.2; }
	CUSTOM_COMPILE_COMMAND="make lock" $(LOCKTOOLS)/bin/pip-compile --quiet --allow-unsafe \
		--strip-extras --no-emit-index-url --no-emit-find-links $(if $(UPGRADE),--upgrade) \
		--extra dev -o $(LOCK) pyproject.toml requirements/lock.in
	# torch without its local build label: the CPU build (2.13.0+cpu) where pip finds it, as
	# here, and PyPI's own 2.13.0 on a machine that has no CPU wheel to hand
	sed -i 's/^torch==\([^+]*\)+cpu$$/torch==\1/' $(LOCK)
	echo "# Installed with --no-deps, not resolved (from requirements/lock.in's #nodeps: lines):" >> $(LOCK)
	sed -n 's/^#nodeps: *//p' requirements/lock.in >> $(LOCK)

demo: $(STAMP)
	$(BIN)/recperf report --out out/report
	@echo "open out/report/report.html"

check: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy

test: check
	$(BIN)/pytest -q

fmt: $(STAMP)
	$(BIN)/ruff check --fix src tests benchmarks examples
	$(BIN)/ruff format src tests benchmarks examples

bench: $(STAMP)
	$(BIN)/python benchmarks/cluster_speed.py

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache
