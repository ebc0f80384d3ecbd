#!/usr/bin/env python3
"""Tables for benches/gateway/run.sh: python3 summarize.py WORKDIR ROUNDS [PATH...].

The loads shown are those of the SECTIONS environment variable (default:
"fixed stream max"), as run.sh ran them.

Each figure is the median of the rounds with the range (min-max) beside
it. Added latency is computed per round (the paths of one round ran back
to back) and then summarised the same way.
"""

import json
import os
import statistics
import sys
from pathlib import Path

PATHS = ["direct", "gateway", "gateway3", "nginx"]
PROXIES = ["gateway", "gateway3", "nginx"]
# Added latency is against `direct`; without it (GATEWAY_PATHS leaving it
# out) those columns are left out, the rest is shown.
TICK_S = 0.01  # USER_HZ = 100


def load(work, name):
    d = json.loads((work / f"{name}.json").read_text())
    d["cpu"] = json.loads((work / f"{name}.cpu.json").read_text())
    d["stats"] = json.loads((work / f"{name}.stats.json").read_text())
    return d


def med(xs, fmt="{:.2f}"):
    xs = list(xs)
    m = statistics.median(xs)
    if len(xs) == 1:
        return fmt.format(m)
    return f"{fmt.format(m)} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


def sim_429(d):
    return sum(d["stats"]["rejected_429"].values())


def not_ok(d):
    return sum(d["non_2xx"].values()) + d["errors"]


def cpu_us_per_req(d):
    n = max(d["sent"], 1)
    return d["cpu"]["proxy_cpu_ticks"] * TICK_S * 1e6 / n


def table(header, rows):
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def main():
    global PATHS, PROXIES
    work = Path(sys.argv[1])
    rounds = int(sys.argv[2])
    if len(sys.argv) > 3:
        PATHS = sys.argv[3:]
        PROXIES = [p for p in PATHS if p != "direct"]
    sections = os.environ.get("SECTIONS", "fixed stream max").split()
    kinds = {}
    for kind in sections:
        kinds[kind] = {p: [load(work, f"{kind}-{p}-{r}") for r in range(1, rounds + 1)] for p in PATHS}

    print(f"\nmedian of {rounds} rounds (min–max); latencies in ms\n")
    if "fixed" in kinds:
        fixed_section(kinds)
    if "stream" in kinds:
        stream_section(kinds)
    if "max" in kinds:
        max_section(kinds)
    if "maxstream" in kinds:
        max_section(kinds, "maxstream", "Streams")
    if "gateway3" in PATHS and {"fixed", "stream", "max"} <= kinds.keys():
        deployments_section(kinds)
    if "gateway" in PATHS and "gateway-otel" in PATHS:
        telemetry_section(kinds)
    if "max" in kinds and "gateway" in PATHS:
        memory_section(work, rounds)


def fixed_section(kinds):
    # -- one-shot, fixed rate ---------------------------------------------
    fixed = kinds["fixed"]
    print(f"### One-shot, open loop, {fixed[PATHS[0]][0]['target_rate']:.0f} requests/s\n")
    rows = []
    for p in PATHS:
        runs = fixed[p]
        rows.append([
            p,
            med((r["achieved_rate"] for r in runs), "{:.0f}"),
            med(r["latency_ms"]["p50"] for r in runs),
            med(r["latency_ms"]["p90"] for r in runs),
            med(r["latency_ms"]["p99"] for r in runs),
            med(r["latency_ms"]["p99.9"] for r in runs),
            str(sum(not_ok(r) for r in runs)),
            str(sum(sim_429(r) for r in runs)),
        ])
    table(["path", "achieved/s", "p50", "p90", "p99", "p99.9", "non-2xx + errors", "sim 429s"], rows)

    if "direct" not in fixed:
        table(["path", "proxy CPU µs/request"],
              [[p, med((cpu_us_per_req(x) for x in fixed[p]), "{:.0f}")] for p in PROXIES])
        return
    rows = []
    for p in PROXIES:
        d50 = [(x["latency_ms"]["p50"] - y["latency_ms"]["p50"]) * 1000 for x, y in zip(fixed[p], fixed["direct"])]
        d99 = [(x["latency_ms"]["p99"] - y["latency_ms"]["p99"]) * 1000 for x, y in zip(fixed[p], fixed["direct"])]
        r50 = [x["latency_ms"]["p50"] / y["latency_ms"]["p50"] for x, y in zip(fixed[p], fixed["direct"])]
        r99 = [x["latency_ms"]["p99"] / y["latency_ms"]["p99"] for x, y in zip(fixed[p], fixed["direct"])]
        cpu = [cpu_us_per_req(x) for x in fixed[p]]
        rows.append([p, med(d50, "{:+.0f}"), med(d99, "{:+.0f}"), med(r50, "{:.2f}×"), med(r99, "{:.2f}×"),
                     med(cpu, "{:.0f}")])
    table(["path", "added p50 µs", "added p99 µs", "p50 / direct", "p99 / direct", "proxy CPU µs/request"], rows)
    ratio = [(g["latency_ms"]["p99"] - d["latency_ms"]["p99"]) / (n["latency_ms"]["p99"] - d["latency_ms"]["p99"])
             for g, n, d in zip(fixed["gateway"], fixed["nginx"], fixed["direct"])
             if n["latency_ms"]["p99"] != d["latency_ms"]["p99"]]
    if ratio:
        print(f"gateway added p99 / nginx added p99, per round: {med(ratio)}"
              f" [{', '.join(f'{r:.2f}' for r in ratio)}]\n")


def stream_section(kinds):
    # -- streaming, fixed rate ----------------------------------------------
    st = kinds["stream"]
    print(f"### Streaming, open loop, {st[PATHS[0]][0]['target_rate']:.0f} streams/s\n")
    rows = []
    for p in PATHS:
        runs = st[p]
        rows.append([
            p,
            med((r["achieved_rate"] for r in runs), "{:.0f}"),
            med(r["ttft_ms"]["p50"] for r in runs),
            med(r["ttft_ms"]["p99"] for r in runs),
            med(r["latency_ms"]["p50"] for r in runs),
            med(r["latency_ms"]["p99"] for r in runs),
            med(r["latency_ms"]["p99.9"] for r in runs),
            str(sum(not_ok(r) for r in runs)),
            str(sum(sim_429(r) for r in runs)),
        ])
    table(["path", "achieved/s", "TTFT p50", "TTFT p99", "stream p50", "stream p99", "stream p99.9",
           "non-2xx + errors", "sim 429s"], rows)
    rows = []
    for p in PROXIES:
        cpu = [cpu_us_per_req(x) for x in st[p]]
        if "direct" not in st:
            rows.append([p, "—", "—", med(cpu, "{:.0f}")])
            continue
        d50 = [(x["ttft_ms"]["p50"] - y["ttft_ms"]["p50"]) * 1000 for x, y in zip(st[p], st["direct"])]
        d99 = [(x["ttft_ms"]["p99"] - y["ttft_ms"]["p99"]) * 1000 for x, y in zip(st[p], st["direct"])]
        rows.append([p, med(d50, "{:+.0f}"), med(d99, "{:+.0f}"), med(cpu, "{:.0f}")])
    table(["path", "added TTFT p50 µs", "added TTFT p99 µs", "proxy CPU µs/stream"], rows)
    for p in PROXIES:
        if p != "nginx" and "nginx" in st:
            ratio = [cpu_us_per_req(g) / cpu_us_per_req(n) for g, n in zip(st[p], st["nginx"])]
            print(f"{p} / nginx CPU per stream, per round: {med(ratio)}"
                  f" [{', '.join(f'{r:.2f}' for r in ratio)}]\n")


def max_section(kinds, kind="max", what="One-shot"):
    # -- closed loop ----------------------------------------------------------
    mx = kinds[kind]
    print(f"### {what}, closed loop, {mx[PATHS[0]][0]['connections']} connections\n")
    rows = []
    for p in PATHS:
        runs = mx[p]
        rows.append([
            p,
            med((r["ok_rate"] for r in runs), "{:,.0f}"),
            med(r["latency_ms"]["p50"] for r in runs),
            med(r["latency_ms"]["p99"] for r in runs),
            med((cpu_us_per_req(r) for r in runs), "{:.0f}") if p != "direct" else "—",
            str(sum(not_ok(r) for r in runs)),
        ])
    table(["path", "responses/s", "p50", "p99", "proxy CPU µs/response", "non-2xx + errors"], rows)
    if "gateway" in mx and "nginx" in mx:
        ratio = [g["ok_rate"] / n["ok_rate"] for g, n in zip(mx["gateway"], mx["nginx"])]
        print(f"gateway / nginx throughput: {med(ratio)}\n")


def telemetry_section(kinds):
    # -- telemetry on (gateway-otel) against off (gateway), same rounds -------
    print("### Telemetry: on (gateway-otel) against off (gateway)\n")
    rows = []
    for kind, label, what in [("fixed", "one-shot, fixed rate", "achieved_rate"),
                              ("stream", "streams, fixed rate", "achieved_rate"),
                              ("max", "one-shot, closed loop", "ok_rate")]:
        if kind not in kinds:
            continue
        off, on = kinds[kind]["gateway"], kinds[kind]["gateway-otel"]
        rate = [(t[what] / g[what] - 1) * 100 for t, g in zip(on, off)]
        cpu = [(cpu_us_per_req(t) / cpu_us_per_req(g) - 1) * 100 for t, g in zip(on, off)]
        rows.append([label, med((g[what] for g in off), "{:,.0f}"), med((t[what] for t in on), "{:,.0f}"),
                     med(rate, "{:+.1f} %"), med((cpu_us_per_req(g) for g in off), "{:.0f}"),
                     med((cpu_us_per_req(t) for t in on), "{:.0f}"), med(cpu, "{:+.1f} %")])
    table(["load", "off /s", "on /s", "throughput on vs off", "off CPU µs/request", "on CPU µs/request",
           "added CPU"], rows)


def deployments_section(kinds):
    # -- three deployments against one ----------------------------------------
    print("### Three deployments against one\n")
    rows = []
    for kind, label in [("fixed", "one-shot, fixed rate"), ("stream", "streams, fixed rate"),
                        ("max", "one-shot, closed loop")] if "gateway3" in PATHS else []:
        runs = kinds[kind]
        added = [(cpu_us_per_req(t) / cpu_us_per_req(g) - 1) * 100
                 for t, g in zip(runs["gateway3"], runs["gateway"])]
        rows.append([label, med((cpu_us_per_req(g) for g in runs["gateway"]), "{:.0f}"),
                     med((cpu_us_per_req(t) for t in runs["gateway3"]), "{:.0f}"), med(added, "{:+.1f} %")])
    if "gateway3" in PATHS:
        table(["load", "1 deployment CPU µs/request", "3 deployments CPU µs/request", "added CPU"], rows)


def memory_section(work, rounds):
    # -- memory ---------------------------------------------------------------
    def kib(path, key):
        for line in (work / path).read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
        return 0

    peaks = []
    for r in range(1, rounds + 1):
        samples = [int(x) for x in (work / f"max-gateway-{r}.rss.txt").read_text().split()]
        peaks.append(max(samples) / 1024)
    print("### Gateway memory\n")
    table(["when", "MiB"], [
        ["idle after start (VmRSS)", f"{kib('gateway-rss-idle.txt', 'VmRSS') / 1024:.1f}"],
        ["peak during the closed-loop runs (VmRSS sampled every 100 ms)", med(peaks, "{:.1f}")],
        ["after all runs (VmRSS)", f"{kib('gateway-rss-after.txt', 'VmRSS') / 1024:.1f}"],
        ["high-water mark over the session (VmHWM)", f"{kib('gateway-rss-after.txt', 'VmHWM') / 1024:.1f}"],
    ])

    statuses = [line for line in (work / "gateway-metrics.txt").read_text().splitlines()
                if line.startswith("tollgate_requests_total")]
    print("gateway requests by status (whole session, warm-up included):")
    for line in statuses:
        print("  " + line)


if __name__ == "__main__":
    main()
