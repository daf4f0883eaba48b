"""The cost of a build without ISA-L (``<!-- bench:crc -->``,
docs/benchmarks.md), rendered from bench/results/crc.json
(``python -m bench.bench_crc``)."""

from __future__ import annotations

from bench.report_format import load, machine_line


def crc_block() -> str:
    res = load("crc")
    if not res:
        return "(no stored results: run `python -m bench.bench_crc`)\n"
    code = {build: next(iter(res["decode"].values()))[build]["crc"]["crc_code"]
            for build in ("isa-l", "zlib")}
    out = [f"Decoding 64 chunks of about 1 MiB with `body=\"view\"`, medians of "
           f"{res['repeat']} runs of {res['decodes_per_run']} decodes each, CPU seconds "
           "per million records:", "",
           "| records | build | CRC checked | CRC off | the CRC's share | "
           "zlib's CRC costs more |",
           "|---|---|---|---|---|---|"]
    for size, by in res["decode"].items():
        for build in ("isa-l", "zlib"):
            on = by[build]["crc"]["summary"]["cpu_s_per_m_median"]
            off = by[build]["no crc"]["summary"]["cpu_s_per_m_median"]
            extra = f"{by['zlib_extra_cpu_s_per_m']:.3f}" if build == "zlib" else ""
            out.append(f"| {size} B | {code[build]} | {on:.3f} | {off:.3f} | "
                       f"{max(on - off, 0.0):.3f} | {extra} |")
    out += ["", "The CRC alone, GB/s (medians):", "",
            "| buffer | " + " | ".join(next(iter(res["crc_only"].values()))) + " |",
            "|---|" + "---|" * len(next(iter(res["crc_only"].values())))]
    for size, by in res["crc_only"].items():
        out.append(f"| {int(size) // 1024} KiB | " + " | ".join(
            f"{v['gb_per_s_median']:.1f}" for v in by.values()) + " |")
    out += ["", machine_line(res["machine"], "Measured")]
    return "\n".join(out) + "\n"
