# Two entry points: `make demo` and `make test`. Each sets up .venv on first use.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
# The torch tests run in CI with this CPU build (users: pip install wangate[torch]).
TORCH_VERSION ?= 2.13.0

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]' 'torch==$(TORCH_VERSION)'
	touch $(STAMP)

.PHONY: setup demo test lint
setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/wangate demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check wangate tests bench examples
	$(VENV)/bin/ruff format --check wangate tests bench examples
	$(VENV)/bin/mypy wangate
