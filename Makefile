# Every target installs what it needs into a project-local virtualenv first,
# so `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test demo bench bench-quick lint typecheck clean

venv: $(STAMP)

# Python >= 3.11 is checked before the venv is made: a venv of an older one stayed, and
# `make PYTHON=python3.11` reused its interpreter.
NEWER := import sys; sys.exit(sys.version_info < (3, 11))

$(STAMP): setup.cfg pyproject.toml
	@$(PYTHON) -c '$(NEWER)' || { echo "jax-metrics-manager needs Python >= 3.11, and \
	$(PYTHON) is older or missing: run make PYTHON=python3.11 (or a newer one)"; exit 1; }
	@if [ -e $(PY) ] && ! $(PY) -c '$(NEWER)' 2>/dev/null; then rm -rf $(VENV); fi
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[demo,plot,test,dev]'
	touch $(STAMP)

# Two workers, one file each at a time: the suite mostly waits on subprocesses, servers and
# deadlines, so it takes about half the time on 2 cores. A file's module fixtures run once.
# PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile

demo: $(STAMP)
	$(PY) -m examples.demo --gin_file=configs/demo.gin

bench: $(STAMP)
	$(PY) -m benchmarks.run_all --write_results

bench-quick: $(STAMP)
	$(PY) -m benchmarks.run_all --quick

lint: $(STAMP)
	$(VENV)/bin/ruff check metrics_manager writers examples tests benchmarks
	$(VENV)/bin/ruff format --check metrics_manager writers examples tests benchmarks

typecheck: $(STAMP)
	$(VENV)/bin/mypy metrics_manager writers examples

clean:
	rm -rf $(VENV) runs *.egg-info
