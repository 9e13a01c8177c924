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

# the integration tests that move messages, again with worker processes ([workers] count = 2)
WORKER_TESTS := tests/test_e2e.py tests/test_localapi_segments.py tests/test_faults.py tests/test_daemon.py \
	tests/test_jobs.py

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q
	WANGATE_TEST_WORKERS=2 $(VENV)/bin/python -m pytest -q -m "not single_process and not slow" $(WORKER_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check wangate tests bench examples
	$(VENV)/bin/ruff format --check wangate tests bench examples
	$(VENV)/bin/mypy wangate
