# Two entry points: `make demo` and `make test`. Each sets up .venv on first use.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
# The torch tests run in CI with this CPU build (users: pip install wangate[torch]).
TORCH_VERSION ?= 2.13.0

# The engine (wangate.engine._engine) and the compiled core (mypyc, setup.py's
# COMPILED_CORE) are built by pip from setup.py: a changed C source, header or core module
# reinstalls, which rebuilds the extensions beside their sources.
ENGINE_SOURCES := $(wildcard wangate/engine/src/*.c wangate/engine/src/*.h)
CORE_SOURCES := $(wildcard wangate/core/*.py)

$(VENV)/bin/python:
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip

$(STAMP): pyproject.toml setup.py Makefile $(ENGINE_SOURCES) $(CORE_SOURCES) | $(VENV)/bin/python
	$(VENV)/bin/pip install -q -e '.[test]' 'torch==$(TORCH_VERSION)'
	touch $(STAMP)

.PHONY: setup demo test lint asan leakcheck fuzz-setup fuzz-build fuzz fuzz-atheris
setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/wangate demo

# the integration tests that move messages, again with worker processes ([workers] count = 2)
WORKER_TESTS := tests/test_e2e.py tests/test_localapi_segments.py tests/test_faults.py tests/test_daemon.py \
	tests/test_jobs.py

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q
	WANGATE_TEST_WORKERS=2 $(VENV)/bin/python -m pytest -q -m "not single_process and not slow" $(WORKER_TESTS)

# The suite once more against an engine built with ASan and UBSan (WANGATE_ENGINE_SANITIZE=1,
# setup.py). gcc's runtimes are preloaded into the interpreter and, through the
# environment, into every daemon a test starts. What the engine mallocs is checked, and
# every Python buffer over 512 bytes (pymalloc hands those to malloc): packets, batches;
# SAN_PYTHONMALLOC=malloc checks the small objects too. CPython itself keeps memory it
# never frees, so leaks are left to make leakcheck. Reports go to files in $(SAN_LOGS),
# one per process (pytest's capture or a deleted daemon log would hide them); any report
# fails the run. libubsan comes first in LD_PRELOAD, or its reports ignore log_path;
# verify_asan_link_order=0 allows that. Only the engine is swapped, rebuilt in place
# (ENGINE_BUILD: the compiled core stays as it is); the normal engine is rebuilt afterwards,
# pass or fail (interrupted, the missing stamp makes the next make reinstall it).
# Cost, against a normal run: 1.1x the wall time of daemon, sim and pure tests (1.25x
# their CPU), 1.7x that of the torch tests, plus two engine builds (5 s each): 8 to 10 min
# for the suite where make test's first run takes 6.5; twice that with SAN_PYTHONMALLOC=malloc.
# The runtimes reach every program a test runs (ip, tc, gcc): ASan's string checks are
# off (replace_str=0 and the intercept_* below) because iproute2's `ip route get` trips
# its own strncpy overlap; the engine uses no str* function. A small quarantine keeps
# freed memory from counting as growth in the tests that bound a daemon's RSS.
# One file while working: make asan PYTEST_ARGS="tests/test_config.py"
PYTEST_ARGS ?=
ENGINE_BUILD := WANGATE_COMPILE_CORE=0 $(VENV)/bin/python setup.py -q build_ext --inplace --force
SAN_LOGS := build/sanitizer
SAN_PYTHONMALLOC ?= pymalloc
SAN_ENV = LD_PRELOAD="$(shell gcc -print-file-name=libubsan.so) $(shell gcc -print-file-name=libasan.so)" \
	PYTHONMALLOC=$(SAN_PYTHONMALLOC) \
	ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:allocator_may_return_null=1:verify_asan_link_order=0:replace_str=0:intercept_strlen=0:intercept_strchr=0:intercept_strndup=0:quarantine_size_mb=16:log_path=$(CURDIR)/$(SAN_LOGS)/asan \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:log_path=$(CURDIR)/$(SAN_LOGS)/ubsan

asan: $(STAMP)
	rm -f $(STAMP)
	rm -rf $(SAN_LOGS) && mkdir -p $(SAN_LOGS)
	@trap '$(ENGINE_BUILD) && touch $(STAMP)' EXIT; \
	WANGATE_ENGINE_SANITIZE=1 $(ENGINE_BUILD) && \
	$(SAN_ENV) $(VENV)/bin/python -m pytest -q $(PYTEST_ARGS); status=$$?; \
	if [ -n "$$(ls $(SAN_LOGS))" ]; then \
		head -n 100 $(SAN_LOGS)/*; echo "make asan: sanitizer reports in $(SAN_LOGS)/"; status=1; \
	fi; exit $$status

# The engine's tests under valgrind (bench/engine/leaks.sh): fails on a block the engine
# allocated and lost. PYTEST_ARGS picks the tests (default: engine crypto and frames).
leakcheck: $(STAMP)
	bench/engine/leaks.sh $(PYTEST_ARGS)

# libFuzzer targets of the engine's decoders (wangate/engine/fuzz/README.md), built with
# clang against the engine's C files (not the Python module's), ASan and UBSan on. Each
# runs FUZZ_SECONDS from the corpus it grew before, seeded from the golden vectors.
FUZZ_SECONDS ?= 60
FUZZ_CC ?= $(shell command -v clang-14 || command -v clang)
FUZZ_PACKAGES := clang-14 libclang-rt-14-dev
FUZZ_DIR := wangate/engine/fuzz
FUZZ_OUT := build/fuzz
FUZZ_TARGETS := fuzz_frames fuzz_packet fuzz_span
FUZZ_CFLAGS := -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
	-fno-sanitize-recover=undefined -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter
ENGINE_C := $(filter-out %/module.c,$(filter-out wangate/engine/src/py_%,$(wildcard wangate/engine/src/*.c)))

fuzz-setup:
	@if [ "$$(id -u)" = 0 ]; then apt-get install -y $(FUZZ_PACKAGES); \
	else echo "make fuzz-setup: as root, run: apt-get install -y $(FUZZ_PACKAGES)"; exit 1; fi

$(FUZZ_OUT)/fuzz_%: $(FUZZ_DIR)/fuzz_%.c $(FUZZ_DIR)/fuzz_check.h $(ENGINE_C) $(wildcard wangate/engine/src/*.h)
	@test -n "$(FUZZ_CC)" || { echo "no clang: make fuzz-setup"; exit 1; }
	@mkdir -p $(FUZZ_OUT)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Iwangate/engine/src -o $@ $< $(ENGINE_C) -lcrypto

fuzz-build: $(addprefix $(FUZZ_OUT)/,$(FUZZ_TARGETS))

fuzz: fuzz-build $(STAMP)
	$(VENV)/bin/python $(FUZZ_DIR)/make_seeds.py $(FUZZ_OUT)/seeds
	@for t in $(FUZZ_TARGETS); do mkdir -p $(FUZZ_OUT)/corpus/$$t; \
		$(FUZZ_OUT)/$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
			-artifact_prefix=$(FUZZ_OUT)/$$t- $(FUZZ_OUT)/corpus/$$t $(FUZZ_OUT)/seeds/$$t \
			$$(ls -d $(FUZZ_DIR)/regressions/$$t 2>/dev/null) || exit 1; \
	done

# The atheris harnesses of the engine through its binding (tests/fuzz/fuzz_engine_*.py),
# FUZZ_SECONDS each, with the engine built by clang with libFuzzer's coverage; the normal
# engine is reinstalled afterwards, as by make asan.
ATHERIS_COVERAGE := -fsanitize-coverage=inline-8bit-counters,pc-table,trace-cmp
ATHERIS_TARGETS ?= engine_frames engine_packet engine_listener engine_shards engine_spans
fuzz-atheris: $(STAMP)
	@test -n "$(FUZZ_CC)" || { echo "no clang: make fuzz-setup"; exit 1; }
	$(VENV)/bin/pip install -q 'atheris>=2.3'
	rm -f $(STAMP)
	@trap '$(ENGINE_BUILD) && touch $(STAMP)' EXIT; \
	CC=$(FUZZ_CC) CFLAGS=$(ATHERIS_COVERAGE) $(ENGINE_BUILD) && \
	for t in $(ATHERIS_TARGETS); do mkdir -p $(FUZZ_OUT)/atheris/$$t; \
		$(VENV)/bin/python tests/fuzz/fuzz_$$t.py $(FUZZ_OUT)/atheris/$$t tests/fuzz/corpus/$$t \
			-max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
			-artifact_prefix=$(FUZZ_OUT)/atheris/$$t- || exit 1; \
	done

lint: $(STAMP)
	$(VENV)/bin/ruff check wangate tests bench examples setup.py
	$(VENV)/bin/ruff format --check wangate tests bench examples setup.py
	$(VENV)/bin/mypy wangate
