"""Build of pystream's C extension ``pystream._core``; the distribution's
metadata (name, version, dependencies, extras) is in pyproject.toml.

The C core links well-kept native libraries from the system or conda:
ISA-L (CRC-32), zlib, lz4, zstd and snappy.

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

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

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
    ext_modules=cythonize([core], language_level=3,
                          compiler_directives={"boundscheck": False,
                                               "wraparound": False}),
    cmdclass={"build_ext": BuildExt},
    # the stable-ABI wheel's tag: cp311-abi3
    options={"bdist_wheel": {"py_limited_api": "cp311"}} if LIMITED_API else {},
)
