"""Build of pystream and its C extension ``pystream._core``.

The C core links well-kept native libraries from the system or conda:
ISA-L (CRC-32), zlib, lz4, zstd and snappy.
"""

import glob
import os
import re

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

# The version lives in pystream/__init__.py; read it without importing.
VERSION = re.search(r'^__version__ = "([^"]+)"',
                    open("pystream/__init__.py").read(), re.M).group(1)

core = Extension(
    "pystream._core",
    sources=["pystream/_core.pyx", *sorted(glob.glob("csrc/*.c"))],
    include_dirs=["csrc", numpy.get_include()],
    libraries=["isal", "z", "lz4", "zstd", "snappy"],
    # LTO lets the per-record calls between csrc/ files inline
    extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra",
                        "-Wno-unused-parameter", "-flto=auto"],
    extra_link_args=["-O3", "-flto=auto"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)

setup(
    name="pystream",
    version=VERSION,
    description="The fastest way to read a RabbitMQ stream from Python: "
                "Deliver frames to Arrow columns in C.",
    long_description=open("README.md").read() if os.path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",
    packages=["pystream", "pystream.spark"],
    package_data={"pystream": ["py.typed", "*.pyi", "*.pyx"]},
    ext_modules=cythonize([core], language_level=3,
                          compiler_directives={"boundscheck": False,
                                               "wraparound": False}),
    install_requires=["numpy>=1.26", "pyarrow>=14"],
    extras_require={
        # PySpark 4.3 warns on pandas 3.
        "spark": ["pyspark[sql]>=4.2", "pandas<3"],
        "test": ["pytest", "pytest-benchmark", "hypothesis", "rbfly", "rstream",
                 "pika", "jinja2", "pyyaml", "atheris",
                 # compresses the golden captures' snappy, lz4 and zstd sub-batches
                 "cramjam",
                 # read streams through the Arrow PyCapsule interface
                 "duckdb", "polars"],
        # the latency benchmark's plots
        "bench": ["matplotlib"],
    },
    entry_points={"console_scripts": ["pystream = pystream.cli:main"]},
    zip_safe=False,
)
