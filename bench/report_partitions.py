"""The partition table (``<!-- bench:partitions -->``, docs/reliability.md),
rendered from bench/results/partitions.json (tests/test_partitions.py, run
by ``make partitions``)."""

from __future__ import annotations

import statistics

from bench.report_format import load, machine_line

# The cases of tests/partitions.py, in its order, as the table names them.
PARTITION_CASES = {
    "leader": "the leader cut off from the other two nodes",
    "client": "the client cut off from the leader (not from the replicas)",
    "one-way": "the leader's packets to the other two dropped (theirs arrive)",
    "flapping": "the leader cut off from everyone, again and again",
}


def seconds(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f} s"


def spaced(n: int) -> str:
    return f"{n:,}".replace(",", " ")


def partitions_block() -> str:
    res = load("partitions")
    if not res:
        return "(no stored results: run `make partitions`)\n"
    out = ["| partition | cut | new leader | producer confirms again | "
           "consumer reads again | confirmed | lost | duplicated | out of order |",
           "|---|---|---|---|---|---|---|---|---|"]
    for case, what in PARTITION_CASES.items():
        r = res["cases"].get(case)
        if r is None:
            continue
        faults = r["faults"]
        cut = (f"{faults[0]['took']:.0f} s" if len(faults) == 1 else
               f"{len(faults)} x {statistics.median(f['took'] for f in faults):.0f} s")
        leader = (f"{r['new_leader']} after {r['new_leader_after']:.1f} s"
                  if r["new_leader"] else f"none ({r['old_leader']} stays)")
        out.append(
            f"| {what} | {cut} | {leader} | {seconds(r['producer_stall'])} "
            f"({seconds(r['producer_after_heal'])} after the heal) | "
            f"{seconds(r['consumer_stall'])} ({seconds(r['consumer_after_heal'])} "
            f"after the heal) | {spaced(r['confirmed'])} of {spaced(r['published'])} | "
            f"{r['lost']} | {r['duplicates']} | {r['out_of_order']} |")
    out += ["", machine_line(res["machine"], "Measured")]
    return "\n".join(out) + "\n"
