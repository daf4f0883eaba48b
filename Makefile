# The two entry points of the README: `make demo` and `make test`.
# Both install what they need (Debian packages, .venv), build the C core and
# start the brokers (scripts/broker) when they are not running.
VENV := .venv
PY := $(VENV)/bin/python
FUZZ_SECONDS ?= 60
SOAK_SECONDS ?= 600

.PHONY: demo test unit lint build deps brokers wheel sdist fuzz soak bench clean

deps:
	scripts/install-deps

build: deps
	$(PY) setup.py -q build_ext --inplace

brokers:
	scripts/broker up

demo: build
	scripts/broker up modern
	$(PY) scripts/demo.py

test: lint build brokers
	$(PY) -m pytest tests
	scripts/fuzz $(FUZZ_SECONDS)
	scripts/fuzz-dispatch 30

# dist/: the sdist and a manylinux wheel (cp311-abi3) that bundles ISA-L,
# zlib, lz4, zstd and snappy, compiled against a Debian bullseye root
# (glibc 2.31) debootstrapped once into ~/.cache/pystream/build.
wheel: deps
	scripts/build-wheel dist

sdist: deps
	$(PY) -m build --sdist --no-isolation --outdir dist .

# ruff over all the Python code, mypy --strict over the package (settings
# and each exception in pyproject.toml); make test runs it first.
lint: deps
	$(PY) -m ruff check pystream tests bench scripts/*.py fuzz/*.py
	$(PY) -m mypy

# The quick tests that need no broker (slow ones build wheels and venvs).
unit: build
	$(PY) -m pytest tests -m "not broker and not slow"

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

# Decode speed (no broker), then reading and publishing end to end against
# the modern broker beside rbfly, rstream and the C wire limits
# (bench/wire), latency at fixed rates beside the C floor (plots in
# bench/results), what the OpenTelemetry metrics cost, Spark reading a
# stream beside Parquet; every result is stored in bench/results and the
# README's tables are rendered from them (each script has --help).
bench: build brokers
	$(MAKE) -s -C bench/wire
	$(PY) bench/bench_decode.py
	$(PY) bench/bench_consume.py
	$(PY) bench/bench_publish.py
	$(PY) bench/bench_latency.py
	$(PY) bench/bench_otel.py --json bench/results/otel.json
	$(PY) bench/bench_spark.py
	$(PY) bench/bench_spark_io.py
	$(PY) bench/report.py

clean:
	rm -rf build dist *.egg-info pystream/_core.c pystream/*.so bench/wire/wire
