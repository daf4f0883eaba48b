"""The benchmarks of a source checkout, run from its root as modules
(``python -m bench.bench_consume``, ``python -m bench.report``, ...); not
part of the installed package."""
