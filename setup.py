"""Build of pystream's C extension ``pystream._core``; the distribution's
metadata (name, version, dependencies, extras) is in pyproject.toml.

The C core links well-kept native libraries from the system or conda:
zlib, which it needs, and ISA-L (CRC-32), lz4, zstd and snappy, which it
uses when the build finds them. Without ISA-L chunk CRCs are checked with
zlib's crc32 (same results, slower); without a codec's library a sub-batch
in that codec raises CodecUnavailable when one comes.
``pystream --version`` and ``pystream.build_info()`` say what a build has.
PYSTREAM_WITHOUT=isal,lz4,... leaves libraries out on purpose;
PYSTREAM_REQUIRE_ALL=1 (scripts/build-wheel; implied by PYSTREAM_DEV) makes
a missing one an error, so that a wheel never lacks one silently.

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
import tempfile

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

LIMITED_API = os.environ.get("PYSTREAM_LIMITED_API") == "1"
DEV = os.environ.get("PYSTREAM_DEV") == "1"
REQUIRE_ALL = DEV or os.environ.get("PYSTREAM_REQUIRE_ALL") == "1"
CSRC = "csrc"

# The optional libraries: library name -> (header, a call that needs it).
OPTIONAL = {
    "isal": ("isa-l/crc.h", "crc32_gzip_refl(0, 0, 0)"),
    "lz4": ("lz4frame.h", "LZ4F_getVersion()"),
    "zstd": ("zstd.h", "ZSTD_versionNumber()"),
    "snappy": ("snappy-c.h", "snappy_max_compressed_length(1)"),
}
WITHOUT = {name.strip() for name in
           os.environ.get("PYSTREAM_WITHOUT", "").split(",") if name.strip()}
if WITHOUT - set(OPTIONAL):
    raise SystemExit(f"PYSTREAM_WITHOUT names {sorted(WITHOUT - set(OPTIONAL))}; "
                     f"it takes {sorted(OPTIONAL)}")

core = Extension(
    "pystream._core",
    sources=["pystream/_core.pyx", *sorted(glob.glob(f"{CSRC}/*.c"))],
    include_dirs=[CSRC],
    libraries=["z"],   # and those of OPTIONAL that BuildExt finds
    # LTO lets the per-record calls between csrc/ files inline
    extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra",
                        "-Wno-unused-parameter", "-flto=auto"],
    extra_link_args=["-O3", "-flto=auto"],
    define_macros=[("Py_LIMITED_API", "0x030B0000")] if LIMITED_API else [],
    py_limited_api=LIMITED_API,
)


class BuildExt(build_ext):
    """build_ext that links the optional libraries it finds and, in
    development builds, compiles csrc/ with -Werror and the generated
    pystream/_core.c without it."""

    def links(self, library: str, header: str, call: str) -> bool:
        """Whether a program calling ``call`` from ``header`` compiles and
        links against ``library`` with this build's compiler and flags."""
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "probe.c")
            with open(src, "w") as f:
                f.write(f"#include <{header}>\nint main(void) {{ (void){call}; return 0; }}\n")
            try:
                objects = self.compiler.compile([src], output_dir=tmp,
                                                include_dirs=self.include_dirs)
                self.compiler.link_executable(objects, os.path.join(tmp, "probe"),
                                              libraries=[library],
                                              library_dirs=self.library_dirs)
            except Exception:  # CompileError, LinkError: not usable here
                return False
        return True

    def build_extensions(self) -> None:
        missing, found, macros = [], [], []
        for library, (header, call) in OPTIONAL.items():
            if library not in WITHOUT and self.links(library, header, call):
                found.append(library)
            else:
                macros.append((f"PS_WITHOUT_{library.upper()}", "1"))
                if library not in WITHOUT:
                    missing.append(library)
        for ext in self.extensions:
            ext.libraries = [*ext.libraries, *found]
            ext.define_macros = [*ext.define_macros, *macros]
        if missing and REQUIRE_ALL:
            raise SystemExit(f"missing libraries {missing} (PYSTREAM_REQUIRE_ALL): "
                             "install their development packages (csrc/DEPENDENCIES)")
        if missing:
            print(f"pystream: building without {', '.join(missing)}: chunk CRCs "
                  "by zlib if ISA-L is missing; a sub-batch in a missing codec "
                  "raises CodecUnavailable")
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
