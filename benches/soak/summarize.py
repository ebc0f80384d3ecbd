#!/usr/bin/env python3
"""Prints the figures of a soak run (benches/soak/run.sh) from its work
directory: report.json (tollgate-soak) and the simulators' /stats."""

import json
import os
import sys

work = sys.argv[1]
r = json.load(open(os.path.join(work, "report.json")))

print(f"\n== {'PASSED' if r['passed'] else 'FAILED'}: {r['done']:,} of {r['requests']:,} requests "
      f"in {r['load_seconds']} s = {r['achieved_rate']:,}/s (target {r['target_rate']}/s), seed {r['seed']}")
wb = r["well_behaved"]
print(f"well-behaved: {wb.get('complete', 0):,} complete, {wb.get('typed_error', 0):,} typed errors, "
      f"{wb.get('other', 0):,} other; violations: {r['violations']}")
print("\noutcomes by client kind and class:")
for cat, classes in r["outcomes"].items():
    total = sum(classes.values())
    print(f"  {cat} ({total:,})")
    for cls, n in sorted(classes.items(), key=lambda kv: -kv[1]):
        print(f"    {n:>8,}  {cls}")
for cat, s in (r.get("stall_close_after_deadline") or {}).items():
    print(f"\n{cat}: connection closed by the gateway after the deadline: {s['count']:,}, "
          f"p50 {s['p50_ms']} ms, p90 {s['p90_ms']} ms, p99 {s['p99_ms']} ms, max {s['max_ms']} ms "
          f"({s['closed_before_deadline']} closed before it"
          + (f", p50 {s['closed_before_deadline_ms']['p50']} ms and at most "
             f"{s['closed_before_deadline_ms']['max']} ms before)" if s.get('closed_before_deadline_ms') else ")"),
          end="")
print()
rss = r["rss_kib"]
mib = lambda kib: f"{kib / 1024:.1f}" if kib else "-"
print(f"\ngateway RSS (MiB): start {mib(rss['start'])}, peak (VmHWM) {mib(rss.get('hwm_kib'))}, "
      f"after the refill {mib(rss['after_refill'])}; growth {rss['growth_pct']} % (medians)")
print("  requests   median of last 10 s   at pause   1 s after the calls ended")
for c in rss["checkpoints"]:
    print(f"  {c['requests']:>8,}   {mib(c['median_10s_kib']):>19}   {mib(c['at_pause_kib']):>8}   "
          f"{mib(c['after_calls_ended_kib']):>25}")
print(f"idle {r['idle_after_seconds']} s after the load; full {r['full_after_seconds']} s after it")
snap = r["snapshot"]
for side in ("upstream", "tenants"):
    sd = snap.get(side) or {}
    print(f"  {side}: active {sd.get('active')}")
    for sc in sd.get("scopes") or []:
        limits = ", ".join(f"{l['dimension']} {l['available']}/{l['capacity']} per {l['window_seconds']} s"
                           for l in sc["limits"])
        print(f"    scope {sc['name']}: queued {sc['queued']}, pending {sc['pending']}, "
              f"admitted {sc['admitted']:,}; {limits}")
    for p in sd.get("pools") or []:
        print(f"    pool {p['name']}: {p['available']}/{p['limit']} available, {p['waiting']} waiting")
print(f"  circuits: {snap.get('circuits')}")
for name in ("slow", "bulk"):
    path = os.path.join(work, f"sim-{name}.stats.json")
    if os.path.exists(path) and os.path.getsize(path):
        print(f"sim {name}: {json.dumps(json.load(open(path)), separators=(',', ':'))}")
cpu_path = os.path.join(work, "cpu.json")
if os.path.exists(cpu_path):
    cpu = json.load(open(cpu_path))
    print(f"CPU seconds over the whole soak (pauses and the refill wait included): gateway "
          f"{cpu['gateway_cpu_seconds']:.1f} ({cpu['gateway_cpu_seconds'] / r['done'] * 1e6:.0f} µs per request), "
          f"simulators {cpu['sim_slow_cpu_seconds']:.1f} + {cpu['sim_bulk_cpu_seconds']:.1f}, "
          f"soak client {r.get('client_cpu_seconds') or 0:.1f}")
print("\nchecks:")
for c in r["checks"]:
    print(f"  {'ok  ' if c['ok'] else 'FAIL'} {c['name']}: {c['detail']}")
for v in r["violation_samples"]:
    print(f"  violation: {v}")
