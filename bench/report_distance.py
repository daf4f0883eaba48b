"""The README's distance block (``<!-- bench:distance -->``), rendered from
bench/results/distance.json (bench/bench_distance.py): reading and
publishing through the delay relay at each added round-trip time."""

from __future__ import annotations

from bench.report_format import count, load, load_range, machine_line, pct, rate, verdict

DISTANCE_TARGET = 0.90          # pystream at the farthest, of its rate at 0 ms
PEERS = ("rbfly", "rstream")


def flow(c: dict | None) -> float | None:
    s = c and c["summary"]
    return s and s.get("flow_msg_per_s_median")


def whole(c: dict | None) -> float | None:
    s = c and c["summary"]
    return s and s["msg_per_s_median"]


def cell(c: dict | None, figure) -> str:
    if c is None:
        return "–"
    x = figure(c)
    return rate(x) if x else "failed"


def ratio(x: float | None, ref: float | None) -> str:
    return pct(x / ref) if x and ref else "–"


def part_table(entry: dict, rtts: list[str], clients: list[str], labels: dict,
               flows: bool) -> list[str]:
    """One row per added round trip: each client's rate (the flow's, and
    the whole window's in brackets, when ``flows``), and pystream's share of
    its own rate at 0 ms."""
    head = ["added round trip"] + [labels[c] for c in clients] + ["pystream / its 0 ms"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = entry["rtt"][rtts[0]].get("pystream")
    for rtt in rtts:
        by = entry["rtt"][rtt]
        cells = []
        for c in clients:
            if flows:
                text = f"{cell(by.get(c), flow)} ({cell(by.get(c), whole)})"
            else:
                text = cell(by.get(c), whole)
            cells.append(f"**{text}**" if c == "pystream" else text)
        p = by.get("pystream")
        share = (f"{ratio(flow(p), flow(base))} ({ratio(whole(p), whole(base))})"
                 if flows else ratio(whole(p), whole(base)))
        out.append(f"| {rtt} ms | " + " | ".join(cells) + f" | {share} |")
    return out


def ahead(entry: dict, rtts: list[str], figure) -> bool | None:
    """pystream ahead of every peer at every distance (None: not measured)."""
    seen = False
    for rtt in rtts:
        by = entry["rtt"][rtt]
        p = figure(by["pystream"]) if "pystream" in by else None
        for peer in PEERS:
            if peer in by:
                x = figure(by[peer])
                if p is None:
                    return False
                seen = True
                if x and x >= p:
                    return False
    return True if seen else None


def distance_block() -> str:
    res = load("distance")
    if not res:
        return "(no stored results: run bench/bench_distance.py)\n"
    rtts = [f"{x:g}" for x in res["rtts_ms"]]
    far = rtts[-1]
    labels = {"wire": "C reference", "pystream": "pystream"}
    out: list[str] = []
    verdicts: list[str] = []
    runs: list[dict] = []
    for part in ("consume", "publish"):
        for entry in res.get(part, {}).values():
            clients = list(next(iter(entry["rtt"].values())))
            for c in clients:
                if c in PEERS:
                    labels[c] = entry["rtt"][rtts[0]][c]["label"]
            for by in entry["rtt"].values():
                for c in by.values():
                    runs += c["runs"]
            size = "1 KiB" if entry["body_size"] == 1024 else f"{entry['body_size']} B"
            flows = part == "consume"
            title = (f"consume {count(entry['messages'])} × {size}, msg/s: the flow "
                     "(first message to last), in brackets the whole window "
                     "(subscribe to last message, connection and handshakes included)"
                     if flows else
                     f"publish {count(entry['messages'])} × {size}, every confirm, "
                     "msg/s (declare to last confirm)")
            out += [f"**{title[0].upper()}{title[1:]}**", ""]
            out += part_table(entry, rtts, clients, labels, flows)
            out.append("")
            p0, pf = entry["rtt"][rtts[0]].get("pystream"), entry["rtt"][far].get("pystream")
            figure = flow if flows else whole
            if p0 and pf and figure(p0) and figure(pf):
                share = figure(pf) / figure(p0)
                what = "flow" if flows else "rate"
                verdicts.append(
                    f"{part} {count(entry['messages'])} × {size}: pystream's {what} at "
                    f"+{far} ms is {pct(share)} of its 0 ms one (target "
                    f"{pct(DISTANCE_TARGET)}: {verdict(share >= DISTANCE_TARGET)})"
                    + (f", its whole-window rate {pct(whole(pf) / whole(p0))}"
                       if flows and whole(p0) and whole(pf) else "")
                    + f"; ahead of rbfly and rstream at every distance: "
                    f"{verdict(ahead(entry, rtts, figure))}")
    out += [f"- {v}" for v in verdicts]
    out += ["", f"Medians of {res['repeat']} runs, each through a fresh relay (0 ms: the "
                f"relay alone); the load average (1 minute, 2 cores) ranged "
                f"{load_range(runs)} during them.",
            "", machine_line(res["machine"], "Measured")]
    return "\n".join(out) + "\n"
