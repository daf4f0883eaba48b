"""Figures for a CPU class this machine is not: an x86-64 CPU with AVX2 and
PCLMULQDQ but neither VPCLMULQDQ nor AVX-512 (AMD Zen 2, Intel Skylake and
Cascade Lake), emulated on one that has them.

    PYSTREAM_BENCH_CPU_CLASS=pclmul .venv/bin/python -m bench.bench_consume \\
        --json bench/results/consume-pclmul.json

The only code path of pystream such a CPU changes is the chunk CRC: ISA-L's
dispatcher picks its by8_02 fold there, by16_10 here (csrc/crc.c,
``pystream._core.crc32_implementation``). ``pclmul.c``, preloaded into
every client process of the run, makes ``crc32_gzip_refl`` that fold. The
development build links ISA-L dynamically, so the preload reaches it (a
wheel's bundled copy would not). The results say so: their ``cpu_class``
names the emulated class and the real one, ``code_paths.crc`` the fold.
What this leaves out: glibc's own memcpy and string functions still take
this CPU's AVX-512 variants.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ENV = "PYSTREAM_BENCH_CPU_CLASS"
HERE = Path(__file__).resolve().parent
CACHE = Path.home() / ".cache" / "pystream" / "build"


@dataclass(frozen=True)
class Emulation:
    name: str
    cpu_class: str   # as tools.results.cpu_class names the real thing
    crc: str         # what code_paths()["crc"] says on such a CPU
    source: Path

    def library(self) -> Path:
        """The preloaded library, built (with the system's ISA-L) when its
        source is newer."""
        out = CACHE / f"cpu-class-{self.name}.so"
        if not out.exists() or out.stat().st_mtime < self.source.stat().st_mtime:
            out.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(out),
                            str(self.source), "-lisal"], check=True)
        return out


EMULATIONS = {
    "pclmul": Emulation("pclmul", "x86-64 AVX2+PCLMUL",
                        "ISA-L crc32_gzip_refl by8_02 (AVX+PCLMULQDQ)",
                        HERE / "pclmul.c"),
}


def chosen() -> Emulation | None:
    """The emulation ``PYSTREAM_BENCH_CPU_CLASS`` names, if any."""
    name = os.environ.get(ENV, "")
    if not name:
        return None
    if name not in EMULATIONS:
        raise SystemExit(f"{ENV}={name}: one of {', '.join(EMULATIONS)}")
    return EMULATIONS[name]


def child_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the emulation's library preloaded, if one is chosen."""
    emulation = chosen()
    if emulation is None:
        return env
    preload = " ".join(filter(None, [str(emulation.library()), env.get("LD_PRELOAD", "")]))
    return {**env, "LD_PRELOAD": preload}


def machine(info: dict) -> dict:
    """A result's machine block, telling the emulated class if one is chosen."""
    emulation = chosen()
    if emulation is None:
        return info
    return {**info,
            "cpu_class": f"{emulation.cpu_class} (emulated on {info['cpu_class']})",
            "code_paths": {**info.get("code_paths", {}),
                           "crc": f"{emulation.crc}, preloaded: bench/cpu_class"},
            "emulated_cpu_class": emulation.name}
