# Two commands: `make run` (set up, start the dashboard) and `make test` (set up, run every test).
PYTHON ?= python3
VENV   := .venv
PORT   ?= 8501
PIP    := $(VENV)/bin/python -m pip
CHROMIUM ?= /usr/bin/chromium

.PHONY: run test lint bench clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# The pinned requirements, then this package itself, editable and without its dependencies (so
# nothing replaces the pinned torch): `import inspector` and `model-inspector` work from any folder.
$(VENV)/.installed: requirements.txt constraints.txt pyproject.toml | $(VENV)/bin/python
	$(PIP) install -r requirements.txt -c constraints.txt
	$(PIP) install --no-deps -e .
	touch $@

$(VENV)/.test-installed: requirements-test.txt $(VENV)/.installed
	$(PIP) install -r requirements-test.txt -c constraints.txt
	touch $@

.PHONY: chromium
# One install at a time (two checkouts' `make test` may start together), waiting for any other apt.
APT := apt-get -qq -o DPkg::Lock::Timeout=600
chromium:
	@if [ ! -x "$(CHROMIUM)" ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO flock /tmp/model-inspector-apt.lock sh -c '[ -x "$(CHROMIUM)" ] || { \
	    echo "installing Debian'"'"'s chromium for the browser tests"; \
	    $(APT) update && DEBIAN_FRONTEND=noninteractive $(APT) install -y chromium; }'; \
	fi

run: $(VENV)/.installed
	$(VENV)/bin/streamlit run app.py --server.port $(PORT)

test: $(VENV)/.test-installed chromium
	$(VENV)/bin/python -m pytest

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: $(VENV)/.installed
	@missed=""; for f in benchmarks/bench_*.py; do echo "== $$f"; $(VENV)/bin/python $$f || missed="$$missed $$f"; done; \
	if [ -n "$$missed" ]; then echo "missed a target or failed:$$missed"; exit 1; fi

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts

.PHONY: zoo
# The bug zoo: planted bugs and healthy loops under the watch, with the baselines (a few minutes, one thread).
zoo: $(VENV)/.test-installed
	$(VENV)/bin/python -m benchmarks.bugzoo --baselines $(ZOO_ARGS)

.PHONY: mutate
# Mutation testing (mutmut, one worker): each trusted module against the tests that cover it; prints each
# module's score and its surviving mutants (benchmarks/mutate.py; MUTATE_ARGS="ties guard --fresh").
mutate: $(VENV)/.test-installed
	$(VENV)/bin/python -m benchmarks.mutate $(MUTATE_ARGS)
