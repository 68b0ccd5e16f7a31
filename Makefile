# Every target installs what it needs into a project-local virtualenv first,
# so `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test demo bench bench-quick lint typecheck clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
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
