"""The metrics' cost block (``<!-- bench:otel -->``, docs/monitoring.md),
rendered from bench/results/otel.json and otel-60s.json
(bench/bench_otel.py)."""

from __future__ import annotations

import statistics

from bench.report_format import count, failures, load, machine_line, ms, rate

OTEL_TARGET = 0.02


def spread(s: dict | None) -> float | None:
    """(highest - lowest run) / median of a mode's msg/s."""
    if not s or not s["msg_per_s_all"]:
        return None
    return (max(s["msg_per_s_all"]) - min(s["msg_per_s_all"])) / s["msg_per_s_median"]


def signed_pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def share_pct(x: float) -> str:
    return f"{x * 100:.1f} %"


def micro(x: float) -> str:
    return f"{x:.2f}" if x < 1 else f"{x:.1f}" if x < 10 else f"{x:.0f}"


def interval(ci: list[float] | None) -> str:
    """A 95 % confidence interval, "" when the results have none (stored
    before bench_otel.py computed them)."""
    return f", 95 % interval {signed_pct(ci[0])} to {signed_pct(ci[1])}" if ci else ""


def judge(cis: dict[str, list[float] | None]) -> str | None:
    """The target judged by the 95 % intervals of paired msg/s changes
    ({row: interval}; None if any is missing): met when every interval
    lies above -2 %, not met when one lies wholly below, else not shown."""
    if not cis or not all(cis.values()):
        return None
    below = [k for k, ci in cis.items() if ci[1] < -OTEL_TARGET]
    if below:
        return "**not met**: " + " and ".join(below) + " slower by more than 2 %"
    wide = [k for k, ci in cis.items() if ci[0] < -OTEL_TARGET]
    if wide:
        return ("**not shown**: the 95 % interval of the paired change reaches below "
                "-2 % for " + " and ".join(wide))
    return "met"


def ci_verdict(rows: dict) -> str | None:
    """The separate processes' verdict: the SDK's paired changes."""
    return judge({k: row["vs_absent"].get("sdk", {}).get("msg_per_s_paired_ci95")
                  for k, row in rows.items()})


WINDOW_MODES = {"sdk": "SDK", "sdk+chunk_size": "SDK with `record_chunk_sizes()`"}


def windows_verdict(windows: dict, mode: str = "sdk") -> str | None:
    """The paired windows' verdict for ``mode`` (the default SDK, or it
    with chunk_size), in the rows that have it."""
    return judge({k.removesuffix("_windows"): row["modes"][mode].get("msg_per_s_paired_ci95")
                  for k, row in windows.items() if mode in row.get("modes", {})})


def windows_block(windows: dict) -> list[str]:
    """The paired windows in one process (bench/otel_windows.py)."""
    rows = {k: row for k, row in windows.items() if "modes" in row}
    failed = [f"{k}: {row['error']}" for k, row in windows.items() if "error" in row]
    if not rows:
        return [f"The paired windows failed ({'; '.join(failed)})."] if failed else []
    consume, publish = rows.get("consume_windows"), rows.get("publish_windows")
    what = []
    if consume:
        what.append(f"a consumer read the whole stream {consume['passes']} times a "
                    f"window, {consume['groups']} groups of windows")
    if publish:
        what.append(f"a producer sent for {publish['seconds']:g} s a window, "
                    f"{publish['groups']} groups")
    spreads = []
    for k, row in rows.items():
        off = row["modes"]["off"]["msg_per_s_all"]
        q = statistics.quantiles(off, n=4, method="inclusive")
        spreads.append(f"{k.removesuffix('_windows')} {rate(q[0])} to {rate(q[2])} "
                       f"msg/s ({(q[2] - q[0]) / statistics.median(off) * 100:.0f} % "
                       "of the median)")
    out = ["**Paired windows in one process** (`bench/otel_windows.py`), where "
           "neighbouring windows share the process, its connections and the "
           "broker's state: " + "; ".join(what) + ", each group taking the modes "
           "in a random order (OpenTelemetry off, the SDK, and consuming also the "
           "SDK with `chunk_size` recorded), one collection of every instrument "
           "at a random moment of each SDK window, as a 1 s periodic reader makes. "
           "The middle half of the off windows still spans "
           + " and ".join(spreads) + ", while the change of each window against "
           "the off window of its group varies far less:", "",
           "| against off, median of the groups (95 % interval) | msg/s | CPU per "
           "message | collections, share of the CPU |",
           "|---|---|---|---|"]
    for k, row in rows.items():
        for mode, label in WINDOW_MODES.items():
            m = row["modes"].get(mode)
            if not m:
                continue
            ci, cci, share = (m["msg_per_s_paired_ci95"], m["cpu_s_per_m_paired_ci95"],
                              m["sdk_cpu_share"])
            out.append(
                f"| {k.removesuffix('_windows')}, {label} | "
                f"{signed_pct(m['msg_per_s_paired'])}"
                + (f" ({signed_pct(ci[0])} to {signed_pct(ci[1])})" if ci else "")
                + f" | {signed_pct(m['cpu_s_per_m_paired'])}"
                + (f" ({signed_pct(cci[0])} to {signed_pct(cci[1])})" if cci else "")
                + f" | {share_pct(share[2])} |")
    out.append("")
    if failed:
        out += [f"Failed: {'; '.join(failed)}.", ""]
    return out


def about(x: float) -> str:
    """7 444 -> "7 400": a count the runs vary, to two figures."""
    return f"{round(x, -2) if x >= 1000 else round(x):,.0f}".replace(",", " ")


def otel_block() -> str:
    """The Monitoring section's cost of the metrics (bench/bench_otel.py)."""
    res = load("otel")
    if not res:
        return "(no stored results: run `make bench`)\n"
    rows, hooks, n = res["rows"], res["hook_costs"], res["repeat"]
    consume, publish = rows.get("consume"), rows.get("publish")
    rpc = consume and consume.get("records_per_chunk_median")
    what = []
    window = next((row["seconds"] for row in rows.values() if "seconds" in row), None)
    if consume and window:
        what.append(f"Consume (reading a stream of {count(consume['stream_messages'])} × "
                    f"{consume['body_size']} B again and again"
                    + (f", about {about(rpc)} records a chunk" if rpc else "") + ")")
    elif consume:
        what.append(f"Consume ({count(consume['messages'])} × {consume['body_size']} B"
                    + (f", about {about(rpc)} records a chunk" if rpc else "") + ")")
    if publish and window:
        what.append(f"publish (batches of 10 000 × {publish['body_size']} B, every "
                    "confirm awaited)")
    elif publish:
        what.append(f"publish ({count(publish['messages'])} × {publish['body_size']} B, "
                    "every confirm awaited)")
    modes = [m for m in ("absent", "api", "sdk")
             if any(m in row["clients"] for row in rows.values())]
    runs = [r for row in rows.values() for c in row["clients"].values() for r in c["runs"]]
    loads = [x[0] for r in runs + list(hooks.values()) for x in r.get("load", []) if x]
    spreads = [(k, [s["msg_per_s_all"] for c in row["clients"].values()
                    if (s := c["summary"])]) for k, row in rows.items()]
    wide = [spread(c["summary"]) for row in rows.values() for c in row["clients"].values()]
    wide = [x for x in wide if x is not None]
    resolves = bool(wide) and max(wide) <= OTEL_TARGET
    ranges = " and ".join(
        f"from {rate(min(min(a) for a in xs))} to {rate(max(max(a) for a in xs))} "
        f"msg/s {'consuming' if k == 'consume' else 'publishing'}"
        for k, xs in spreads if xs)
    rotated = res.get("order") == "rotated"
    names = {"absent": "OpenTelemetry absent", "api": "the API without an SDK",
             "sdk": "the SDK with a periodic reader collecting every "
                    f"{res['sdk_export_interval_s']:g} s"}
    collections = [r["collections"] for r in runs if "collections" in r]
    out = [" and ".join(what)
           + (f" ran in windows of {window:g} s (counting the messages read or "
              "confirmed in each)," if window else " ran")
           + f" {n} time{'s' if n > 1 else ''} in each mode, taking turns: "
           + (", ".join(names[m] for m in modes[:-1]) + " and " if len(modes) > 1 else "")
           + names[modes[-1]]
           + (f", {statistics.median(collections):g} collections in the median SDK "
              "window" if collections else "")
           + (" (each repetition starting one run further on, so that no mode always "
              "runs first)" if rotated else "")
           + f". The machine has {res['machine']['cores']} cores shared with the broker "
           "and other work (load average "
           + (f"{min(loads):.1f} to {max(loads):.1f}" if loads else "unknown")
           + f" during the runs), and it shows: the same mode's runs spread {ranges}"
           + (f", up to {max(wide) * 100:.0f} % of a median" if wide else "")
           + ((", so these medians cannot resolve a 2 % difference (the paired "
               "changes below are judged by a confidence interval):" if ci_verdict(rows) else
               ", so these medians cannot resolve a 2 % difference:")
              if not resolves else ", within 2 % of the medians:"), "",
           f"| median of {n} | " + " | ".join(
               {"absent": "absent", "api": "API only",
                "sdk": f"SDK, {res['sdk_export_interval_s']:g} s reader"}[m]
               for m in modes) + " |",
           "|---" * (len(modes) + 1) + "|"]
    for k, row in rows.items():
        for key, fmt, field in (("msg/s", rate, "msg_per_s_median"),
                                ("CPU s per M msg", lambda x: f"{x:.3f}",
                                 "cpu_s_per_m_median")):
            cells = []
            for m in modes:
                s = row["clients"].get(m, {}).get("summary")
                if s is None:
                    cells.append("failed" if m in row["clients"] else "–")
                    continue
                cell = fmt(s[field])
                change = row["vs_absent"].get(m, {}).get(
                    "msg_per_s" if field == "msg_per_s_median" else "cpu_s_per_m")
                if change is not None and m == "sdk":
                    cell += f" ({signed_pct(change)})"
                cells.append(cell + failures(row["clients"][m]["runs"])
                             if field == "msg_per_s_median" else cell)
            out.append(f"| {k}, {key} | " + " | ".join(cells) + " |")
    out.append("")
    paired_rows = []
    for k, row in rows.items():
        xs = []
        for m in ("api", "sdk"):
            v = row["vs_absent"].get(m, {})
            if v.get("msg_per_s_paired") is None:
                continue
            x = f"{'API only' if m == 'api' else 'SDK'} {signed_pct(v['msg_per_s_paired'])}"
            q = v.get("msg_per_s_paired_quartiles")
            if q:
                x += (f" (middle half {signed_pct(q[1])} to {signed_pct(q[3])}"
                      + interval(v.get("msg_per_s_paired_ci95")) + ")")
            if v.get("cpu_s_per_m_paired") is not None:
                x += f", CPU per message {signed_pct(v['cpu_s_per_m_paired'])}"
                q = v.get("cpu_s_per_m_paired_quartiles")
                if q:
                    x += (f" ({signed_pct(q[1])} to {signed_pct(q[3])}"
                          + interval(v.get("cpu_s_per_m_paired_ci95")) + ")")
            xs.append(x)
        if xs:
            paired_rows.append(f"{k}: " + "; ".join(xs))
    if paired_rows:
        out += ["Each run against the absent run of the same repetition"
                + ("" if rotated else " (the modes always run in the order absent, API, SDK)")
                + ", the median change in msg/s and in the client's CPU per message, "
                "with the quartiles of those changes"
                + (" and a bootstrap 95 % confidence interval of their median"
                   if ci_verdict(rows) else "")
                + ": " + "; ".join(paired_rows) + ".", ""]
    out += windows_block(res.get("windows") or {})
    if publish and publish["vs_absent"].get("sdk"):
        v = publish["vs_absent"]["sdk"]
        out += ["The publish path makes no OpenTelemetry call (its counters are plain "
                "integers read at collection), so what separates its modes here ("
                f"{signed_pct(v['msg_per_s'])} in msg/s, {signed_pct(v['cpu_s_per_m'])} "
                "in CPU per message for the SDK) is the noise of this measure.", ""]
    sdk, absent = hooks.get("sdk", {}), hooks.get("absent", {})
    share = None
    if "chunk_hook_us" in sdk and "chunk_hook_us" in absent:
        cold = "chunk_hook_cold_us" in sdk and "chunk_hook_cold_us" in absent
        text = ("The costs measured alone (thread CPU time" if "clock" in sdk
                else "The costs measured alone (")
        if cold:
            text += ("; back to back, and after copying 3.2 MB as decoding a chunk "
                     "does, which evicts the SDK's code from the CPU's caches")
        text += (f"): the per-chunk hook takes {micro(absent['chunk_hook_us'])} µs without "
                 f"the SDK (three integer counters) and {micro(sdk['chunk_hook_us'])} µs "
                 "with it and `record_chunk_sizes()` (holding the `chunk_size` value "
                 "for the next collection)")
        if cold:
            text += (f", {micro(absent['chunk_hook_cold_us'])} and "
                     f"{micro(sdk['chunk_hook_cold_us'])} µs after the copy")
        if sdk.get("chunk_size_record_us") is not None:
            text += (". One `chunk_size` histogram value takes the SDK "
                     f"{micro(sdk['chunk_size_record_us'])} µs"
                     + (f", {micro(sdk['chunk_size_record_cold_us'])} µs after the copy"
                        if "chunk_size_record_cold_us" in sdk else "")
                     + " (without attributes, as it records them; the SDK builds a "
                     "measurement, asks the exemplar filter and locks the aggregation "
                     "for each, and the API has no call for several values or for one value seen "
                     "n times)")
            if sdk.get("chunk_size_flush_us") is not None:
                text += (f"; recorded by a collection among 2 000 held, "
                         f"{micro(sdk['chunk_size_flush_us'])} µs a value")
        base = consume and consume["clients"].get("absent", {}).get("summary")
        if rpc and base and sdk.get("chunk_size_flush_us") is not None:
            chunk_us = sdk["chunk_size_flush_us"] + max(
                0.0, sdk["chunk_hook_us"] - absent["chunk_hook_us"])
            per_record = chunk_us * 1e3 / rpc
            cpu_record = base["cpu_s_per_m_median"] * 1e3
            share = per_record / cpu_record
            text += (f". Held and recorded so, a chunk's value costs {per_record:.1f} ns "
                     f"a record at {about(rpc)} records a chunk against some "
                     f"{cpu_record:.0f} ns of CPU a record consumed: about "
                     f"{share * 100:.1f} % of the CPU counted so, more with smaller "
                     "chunks at a high rate (what it costs in throughput: the paired "
                     "windows above)")
        if sdk.get("batch_hook_us") is not None:
            text += (f". Publishing, the per-batch counters take "
                     f"{micro(sdk['batch_hook_us'])} µs a batch of 10 000 messages")
        if sdk.get("collect_ms") is not None:
            text += (f". A collection of every instrument takes about "
                     f"{sdk['collect_ms']:.1f} ms plus one stream-statistics request per "
                     "consumer for the lag")
        out += [text + ". Without the API nothing is measurable.", ""]
    in_run = {k: row["sdk_cpu_share"] for k, row in rows.items()
              if (row.get("sdk_cpu_share") or {}).get("total")}
    if in_run:
        parts = []
        for k, q in in_run.items():
            t = q["total"]
            ci = q.get("total_ci95")
            part = (f"{k} {share_pct(t[2])} (middle half {share_pct(t[1])} to "
                    f"{share_pct(t[3])}, runs {share_pct(t[0])} to {share_pct(t[4])}"
                    + (f", 95 % interval {share_pct(ci[0])} to {share_pct(ci[1])}"
                       if ci else "") + ")")
            if k == "consume" and q.get("reader"):
                part += f", of which the reader's own records {share_pct(q['reader'][2])}"
            parts.append(part)
        out += ["In the SDK runs themselves, the SDK's work measured in thread CPU where "
                "it runs (every collection and export, with the `chunk_size` values "
                "it records when they are asked for, those still held when the run "
                "ends, and any the reader recorded itself, past "
                + f"{res['chunk_size_held']:,}".replace(",", " ")
                + " held) against the client's CPU over the run (median of "
                f"{n}): " + "; ".join(parts) + ". A share of the same run's CPU, it "
                "moves far less with the machine's load than the throughput does; "
                "it leaves out holding each value (measured alone above) and what the "
                "SDK costs indirectly (caches, the collector thread's wake-ups).", ""]
    slow = load("otel-60s")
    if slow and slow["rows"].get("consume", {}).get("sdk_cpu_share"):
        q = slow["rows"]["consume"]["sdk_cpu_share"]
        c, ci = q["total"], q.get("total_ci95")
        p = slow["rows"].get("publish", {}).get("sdk_cpu_share", {}).get("total")
        own = q.get("reader") and q["reader"][2] > 0
        fell = [r["collections"] for r in slow["rows"]["consume"]["clients"]["sdk"]["runs"]
                if "collections" in r]
        fell_text = (f"{statistics.median(fell):g} collections fell in the median run"
                     if fell and statistics.median(fell) else "no collection falls in a run")
        out += [f"With a reader every {slow['sdk_export_interval_s']:g} s instead, as "
                f"deployments collect ({slow['repeat']} runs of absent and SDK taking "
                f"turns, `bench/results/otel-60s.json`, commit "
                f"`{slow['machine']['commit'][:10]}`, load average "
                f"{slow['machine']['loadavg_start'][0]:.1f}), {fell_text}, and the "
                "SDK's work "
                + ("(the reader's own records past "
                   + f"{slow['chunk_size_held']:,}".replace(",", " ")
                   + f" held, {share_pct(q['reader'][2])}, and the values held when the "
                   "window ends) "
                   if own else "(with the values held when its window ends) ")
                + f"took {share_pct(c[2])} of consume CPU (runs {share_pct(c[0])} to "
                f"{share_pct(c[4])}"
                + (f", 95 % interval {share_pct(ci[0])} to {share_pct(ci[1])}" if ci else "")
                + ")" + (f", and publishing {share_pct(p[2])}" if p else "") + ".", ""]
    setups = {m: [r["setup_ms"] for row in rows.values()
                  for r in row["clients"].get(m, {}).get("runs", []) if "setup_ms" in r]
              for m in ("api", "sdk")}
    if all(setups.values()):
        out += ["Once per process, before the clock: importing the OpenTelemetry API "
                f"and making the instruments took {ms(statistics.median(setups['api']))} "
                "ms of CPU (the API only), making them on an SDK already imported "
                f"{ms(statistics.median(setups['sdk']))} ms.", ""]
    sdk_changes = [row["vs_absent"].get("sdk", {}).get("msg_per_s") for row in rows.values()]
    within = all(x is not None and x >= -OTEL_TARGET for x in sdk_changes)
    by_ci = ci_verdict(rows)
    windows = res.get("windows") or {}
    by_windows = windows_verdict(windows)
    if by_windows is not None:
        verdict_text = ("by the paired windows' 95 % intervals, with the SDK as "
                        "pystream sets it up by default, " + by_windows)
        chunked = windows_verdict(windows, "sdk+chunk_size")
        if chunked is not None:
            verdict_text += "; with `record_chunk_sizes()`, " + chunked
        if by_ci is not None:
            verdict_text += "; by the separate processes, " + by_ci
    elif by_ci is not None:
        verdict_text = by_ci + (" (the paired changes' 95 % intervals above)")
        if in_run:
            verdict_text += ("; what the SDK adds took " + " and ".join(
                f"{share_pct(q['total'][2])} of the {k} runs' CPU ("
                + ("within" if q["total"][2] <= OTEL_TARGET else "over") + " 2 %)"
                for k, q in in_run.items()) + " (medians)")
    elif resolves and within and share is not None and share <= OTEL_TARGET:
        verdict_text = "met"
    elif not resolves:
        verdict_text = ("**not shown** on this shared, noisy machine: the runs of one "
                        "mode spread wider than the 2 % to be resolved")
        for k, row in rows.items():
            v = row["vs_absent"]
            x = v.get("sdk", {}).get("msg_per_s_paired")
            if x is not None and x < -OTEL_TARGET:
                api = v.get("api", {}).get("msg_per_s_paired")
                verdict_text += (f"; as measured, {k} with the SDK was {-x * 100:.1f} % "
                                 "slower than without OpenTelemetry"
                                 + (f" (the API alone {-api * 100:.1f} %)"
                                    if api is not None and api < 0 else "")
                                 + ", over the target unless the noise accounts for it")
        if in_run:
            figures = {k: q["total"][2] for k, q in in_run.items()}
            verdict_text += ("; measured in the runs as a share of their CPU, what the "
                             "SDK adds took " + " and ".join(
                                 f"{share_pct(x)} {k}" for k, x in figures.items())
                             + " (medians): " + ", ".join(
                                 f"{k} {'within' if x <= OTEL_TARGET else 'over'} 2 %"
                                 for k, x in figures.items()))
        elif share is not None:
            verdict_text += (f"; the CPU measured alone puts the consume path's cost at "
                             f"{share * 100:.1f} %")
    else:
        verdict_text = "**not met**"
    out += [f"Target, the SDK costing at most 2 % of throughput: {verdict_text}.", ""]
    m = res["machine"]
    v = m["versions"]
    mine = f"pystream {v.get('pystream')}"
    otel = ", ".join(f"{k} {v[k]}" for k in ("opentelemetry-api", "opentelemetry-sdk")
                     if v.get(k))
    out.append(machine_line({**m, "versions": {"pystream": v.get("pystream")}}, "Measured")
               .replace(mine, f"{mine}, {otel}" if otel else mine, 1))
    return "\n".join(out) + "\n"


# bench_spark_io.py's ratios (rate over rate, of the medians): the two
# cases, the target the ratio is held to, what they are in a sentence
