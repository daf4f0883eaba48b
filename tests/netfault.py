"""Real network faults between the netcluster's namespaces (`scripts/broker
up netcluster`): cut links with nftables, drop a share of packets at
random, limit a member's bandwidth with tc. Every rule lives in a table
(``inet pystream_fault``) or qdisc of one member's own namespace, never in
the host's; ``heal`` removes them.

Members: ``net1``, ``net2``, ``net3`` (the nodes) and ``client`` (where the
tests' clients run). A cut is made in the namespace of its first member:
``cut("net1", "net2")`` drops what net1 sends to net2 and what it receives
from net2; ``way="out"`` only the first, ``way="in"`` only the second.

    .venv/bin/python -m tests.netfault cut net1 net2 net3      # net1 from net2 and net3
    .venv/bin/python -m tests.netfault cut net1 net2 --way out # one way
    .venv/bin/python -m tests.netfault loss client 5           # 5 % of packets in
    .venv/bin/python -m tests.netfault rate net1 1mbit         # net1 sends at 1 Mbit/s
    .venv/bin/python -m tests.netfault heal [MEMBER...]        # all of it, everywhere
    .venv/bin/python -m tests.netfault show
"""

from __future__ import annotations

import argparse
import ipaddress
import subprocess
import sys
from collections.abc import Iterable

from .brokers import NETCLUSTER
from .brokers import NODES as NODES_TABLE

NODES = tuple(node.name for node in NETCLUSTER)
ADDRESS = {name: NODES_TABLE[name].host for name in (*NODES, "client")}
NETWORK = ipaddress.ip_network(f"{ADDRESS['client']}/24", strict=False)
STREAM_PORT = NETCLUSTER[0].stream
TABLE = "pystream_fault"
DEVICE = "eth0"                  # each member's end of its veth pair
TIMEOUT = 10                     # seconds for one nft or tc command


def namespace(member: str) -> str:
    if member not in ADDRESS:
        raise ValueError(f"unknown member {member!r}: one of {', '.join(ADDRESS)}")
    return f"pystream-{member}"


def uri(node: str) -> str:
    """The stream URI of a netcluster node, as seen from the client namespace."""
    return NODES_TABLE[node].uri()


def run_in(member: str, *command: str, stdin: str | None = None,
           check: bool = True) -> subprocess.CompletedProcess:
    """Run ``command`` in ``member``'s network namespace."""
    done = subprocess.run(["ip", "netns", "exec", namespace(member), *command],
                          input=stdin, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
    if check and done.returncode:
        raise RuntimeError(f"{' '.join(command)} in {member}: "
                           f"{done.stderr.strip() or done.returncode}")
    return done


def _rules(member: str, lines: Iterable[str]) -> None:
    """Add nft rules to ``member``'s fault table, creating it (and its
    input and output chains, which accept by default) if needed."""
    script = [f"table inet {TABLE} {{",
              "  chain input { type filter hook input priority 0; policy accept; }",
              "  chain output { type filter hook output priority 0; policy accept; }",
              "}", *lines]
    run_in(member, "nft", "-f", "-", stdin="\n".join(script) + "\n")


def cut(member: str, *others: str, way: str = "both") -> None:
    """Cut ``member`` off from each of ``others``: drop the packets it sends
    them (``way`` "out" or "both") and those it receives from them ("in" or
    "both"). Existing connections stay open but silent, as behind a real
    partition."""
    if way not in ("both", "in", "out"):
        raise ValueError(f"way must be both, in or out, not {way!r}")
    lines = []
    for other in others:
        namespace(other)
        if way in ("both", "out"):
            lines.append(f"add rule inet {TABLE} output ip daddr {ADDRESS[other]} drop")
        if way in ("both", "in"):
            lines.append(f"add rule inet {TABLE} input ip saddr {ADDRESS[other]} drop")
    _rules(member, lines)


def isolate(member: str, way: str = "both") -> None:
    """Cut ``member`` off from every other member (nodes and client)."""
    cut(member, *(m for m in ADDRESS if m != member), way=way)


def loss(member: str, percent: float) -> None:
    """Drop ``percent`` % of the packets ``member`` receives, at random."""
    if not 0 < percent <= 100:
        raise ValueError(f"percent must be in (0, 100], not {percent}")
    # numgen draws 0..9999 per packet: hundredths of a percent.
    rule = (f"add rule inet {TABLE} input ip saddr {NETWORK} "
            f"numgen random mod 10000 < {round(percent * 100)} drop")
    _rules(member, [rule])


def rate(member: str, limit: str, burst: str = "32kbit") -> None:
    """Limit what ``member`` sends (e.g. ``"1mbit"``) by a token bucket on
    its end of the link."""
    run_in(member, "tc", "qdisc", "replace", "dev", DEVICE, "root", "tbf",
           "rate", limit, "burst", burst, "latency", "400ms")


def heal(*members: str) -> None:
    """Remove every rule and rate limit from ``members`` (default: all)."""
    for member in members or tuple(ADDRESS):
        run_in(member, "nft", "delete", "table", "inet", TABLE, check=False)
        run_in(member, "tc", "qdisc", "del", "dev", DEVICE, "root", check=False)


def show(member: str) -> str:
    """``member``'s fault rules and qdisc, as nft and tc list them."""
    rules = run_in(member, "nft", "list", "table", "inet", TABLE, check=False)
    qdisc = run_in(member, "tc", "qdisc", "show", "dev", DEVICE, check=False)
    return (rules.stdout if rules.returncode == 0 else "") + qdisc.stdout


def reachable(source: str, target: str, port: int = STREAM_PORT, timeout: float = 1.0) -> bool:
    """Whether ``source`` can open a TCP connection to ``target``'s port."""
    probe = ("import socket,sys; socket.create_connection("
             f"({ADDRESS[target]!r}, {port}), timeout={timeout})")
    return run_in(source, sys.executable, "-c", probe, check=False).returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("cut", help="cut MEMBER off from OTHERS")
    p.add_argument("member")
    p.add_argument("others", nargs="+")
    p.add_argument("--way", choices=("both", "in", "out"), default="both")
    p = sub.add_parser("isolate", help="cut MEMBER off from every other member")
    p.add_argument("member")
    p.add_argument("--way", choices=("both", "in", "out"), default="both")
    p = sub.add_parser("loss", help="drop PERCENT %% of what MEMBER receives")
    p.add_argument("member")
    p.add_argument("percent", type=float)
    p = sub.add_parser("rate", help="limit what MEMBER sends (tc tbf)")
    p.add_argument("member")
    p.add_argument("limit")
    p = sub.add_parser("heal", help="remove the faults (default: everywhere)")
    p.add_argument("members", nargs="*")
    sub.add_parser("show", help="list every member's faults")
    args = ap.parse_args(argv)
    if args.command == "cut":
        cut(args.member, *args.others, way=args.way)
    elif args.command == "isolate":
        isolate(args.member, way=args.way)
    elif args.command == "loss":
        loss(args.member, args.percent)
    elif args.command == "rate":
        rate(args.member, args.limit)
    elif args.command == "heal":
        heal(*args.members)
    else:
        for member in ADDRESS:
            print(f"--- {member}\n{show(member)}", end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
