# The two entry points of the README: `make demo` and `make test`.
# Both install what they need (Debian packages, .venv), build the C core and
# start the brokers (scripts/broker) when they are not running.
VENV := .venv
PY := $(VENV)/bin/python
FUZZ_SECONDS ?= 60
SOAK_SECONDS ?= 600
# Every bash script (the ones without a .sh suffix start with a bash shebang).
SHELL_SCRIPTS := $(shell grep -l -d skip '^\#!/usr/bin/env bash' scripts/* .ci/*) scripts/lib/*.sh

.PHONY: demo test check unit lint build deps brokers docs wheel sdist fuzz soak faults partitions platforms bench clean

deps:
	scripts/install-deps

# The extension in place (PYSTREAM_DEV=1: a warning in csrc/ is an error,
# see setup.py), and the delay relay tests/test_relay.py and the
# distance benchmark put between client and broker (bench/relay).
build: deps
	PYSTREAM_DEV=1 $(PY) setup.py -q build_ext --inplace
	$(MAKE) -s -C bench/relay

brokers:
	scripts/broker up

demo: build
	scripts/broker up modern
	$(PY) scripts/demo.py

test: lint build brokers docs
	$(PY) -m pytest tests --durations=25
	scripts/fuzz $(FUZZ_SECONDS)
	scripts/fuzz-dispatch 30

# What a developer runs before each commit (under 10 minutes on 2 cores):
# the unit tests and the broker tests but those marked slow or spark
# (pyproject.toml says what they mark); make test runs everything.
check: lint build brokers
	$(PY) -m pytest tests -m "not slow and not spark" --durations=25

# The documentation site (docs/, mkdocs.yml) into site/. --strict: a broken
# link or anchor, an API entry that does not resolve, or a public name
# without a docstring or missing from the reference (docs/hooks.py) fails
# it. tests/test_readme.py runs the pages' examples, tests/test_docs.py
# opens the site in headless Chromium.
docs: deps
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# dist/: the sdist and manylinux wheels (x86-64 cpXY and cp311-abi3,
# aarch64 cp311-abi3 cross-compiled) that bundle ISA-L, zlib, lz4, zstd and
# snappy, compiled against Debian bullseye roots (glibc 2.31) made once in
# ~/.cache/pystream/build.
wheel: deps
	scripts/build-wheel dist

sdist: deps
	$(PY) -m build --sdist --no-isolation --outdir dist .

# ruff over all the Python code, mypy --strict over the package (settings
# and each exception in pyproject.toml), cppcheck over the C core (its
# suppressions, each with its reason, in csrc/cppcheck.supp), shellcheck
# over the bash scripts (settings in .shellcheckrc); make test runs it first.
lint: deps
	$(PY) -m ruff check pystream tests bench tools docs scripts/*.py fuzz/*.py
	$(PY) -m mypy
	cppcheck --enable=warning,style,performance,portability --std=c11 -q \
		--error-exitcode=1 --inline-suppr --suppressions-list=csrc/cppcheck.supp \
		-I csrc csrc
	shellcheck $(SHELL_SCRIPTS)

# The quick tests that need no broker (slow ones build wheels and venvs).
unit: build
	$(PY) -m pytest tests -m "not broker and not slow" --durations=25

# Longer runs: make fuzz FUZZ_SECONDS=1800 (the C core, then the Python
# frame dispatch with atheris)
fuzz: deps
	scripts/fuzz $(FUZZ_SECONDS)
	scripts/fuzz-dispatch $(FUZZ_SECONDS)

# A producer and a consumer at 5000 msg/s for SOAK_SECONDS while the modern
# broker closes connections, pauses past the heartbeat and restarts, one
# fault every 30 s (make test runs an 80 s one in tests/test_soak.py).
soak: build brokers
	$(PY) -m tests.soak --seconds $(SOAK_SECONDS) --json bench/results/soak.json

# The fault x feature matrix (tests/faults.py): every reading and writing
# path while the modern broker closes the connections, pauses past the
# heartbeat or restarts, and while the application raises, is cancelled or
# killed (make test runs it in tests/test_fault_matrix.py); stored in
# bench/results/faults.json and rendered into docs/reliability.md, failing
# cells included (the exit status says whether there were any).
faults: build brokers
	$(PY) -m tests.faults --json bench/results/faults.json; status=$$?; \
		$(PY) -m bench.report && exit $$status

# True network partitions of a three-node cluster in network namespaces
# (scripts/broker up netcluster, started and removed by the tests; make test
# runs them too), stored in bench/results/partitions.json and rendered into
# docs/reliability.md.
partitions: build
	PYSTREAM_PARTITION_RESULTS=bench/results/partitions.json $(PY) -m pytest tests/test_partitions.py -v
	$(PY) -m bench.report

# The aarch64 wheel of make wheel under qemu-user (tests/test_platforms.py):
# the C core's broker-free tests, a consumer of the modern broker, the CRC
# code it reports; the decode rate natively and emulated is stored in
# bench/results/platforms.json. The first run unpacks the arm64 Debian
# roots into ~/.cache/pystream/build.
platforms: deps brokers
	PYSTREAM_PLATFORM_RESULTS=bench/results/platforms.json $(PY) -m pytest tests/test_platforms.py -v --durations=10

# Decode speed (no broker), then reading and publishing end to end against
# the modern broker beside rbfly, rstream and the C reference clients
# (bench/wire), the same through a relay that adds 0-20 ms of round trip
# (bench/relay), latency at fixed rates beside the C reference (plots in
# bench/results), what the OpenTelemetry metrics cost, Spark reading a
# stream beside Parquet; every result is stored in bench/results and the
# README's tables are rendered from them (each script has --help).
bench: build brokers
	$(MAKE) -s -C bench/wire
	$(PY) -m bench.bench_decode
	$(PY) -m bench.bench_consume
	$(PY) -m bench.bench_publish
	$(PY) -m bench.bench_distance
	$(PY) -m bench.bench_latency
	$(PY) -m bench.bench_otel --json bench/results/otel.json
	$(PY) -m bench.bench_otel --only absent,sdk --interval 60 --repeat 6 \
		--rows consume,publish --json bench/results/otel-60s.json
	$(PY) -m bench.bench_spark
	$(PY) -m bench.bench_spark_io
	$(PY) -m bench.report

clean:
	rm -rf build dist site *.egg-info pystream/_core.c pystream/*.so bench/wire/wire \
		bench/relay/relay
