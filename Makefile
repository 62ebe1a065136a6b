# recperf: `make demo` runs the main job, `make test` runs lint, type check and the test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check fmt bench clean

# torch goes in first, pinned: any other torch request downloads a multi-GB CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	# The embedding peers (tests and benchmarks/embed_cpu.py): TorchRec's own requirements would
	# replace torch, so it and its few pure-Python imports go in without dependencies.
	$(BIN)/pip install --quiet fbgemm-gpu-cpu==1.8.0
	$(BIN)/pip install --quiet --no-deps torchrec==1.8.0 tensordict==0.15.3 pyvers==0.2.3 \
		pyre-extensions==0.0.32 typing-inspect==0.9.0
	touch $(STAMP)

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
