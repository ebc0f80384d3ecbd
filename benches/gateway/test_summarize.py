#!/usr/bin/env python3
"""Checks of summarize.py on a synthetic work directory (no servers):
python3 benches/gateway/test_summarize.py

Each case writes what run.sh writes for its GATEWAY_PATHS and checks that
the tables come out, whichever paths were left out.
"""

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent


def write_run(work, name, rate, cpu_ticks):
    lat = {"p50": 1.0, "p90": 1.5, "p99": 2.0, "p99.9": 3.0}
    (work / f"{name}.json").write_text(json.dumps({
        "target_rate": 2000.0, "achieved_rate": rate, "ok_rate": rate, "connections": 64,
        "sent": int(rate * 10), "non_2xx": {}, "errors": 0,
        "latency_ms": lat, "ttft_ms": lat,
    }))
    (work / f"{name}.cpu.json").write_text(json.dumps({"sim_cpu_ticks": 10, "proxy_cpu_ticks": cpu_ticks}))
    (work / f"{name}.stats.json").write_text(json.dumps({"rejected_429": {}}))


def fake_work(work, paths, rounds=2):
    for kind in ["fixed", "stream", "max", "maxstream"]:
        for p in paths:
            for r in range(1, rounds + 1):
                rate = 1000.0 if p == "gateway-otel" else 1040.0
                write_run(work, f"{kind}-{p}-{r}", rate, 300)
    for r in range(1, rounds + 1):
        (work / f"max-gateway-{r}.rss.txt").write_text("1000\n2000\n")
    (work / "gateway-rss-idle.txt").write_text("VmRSS:\t1000 kB\nVmHWM:\t1000 kB\n")
    (work / "gateway-rss-after.txt").write_text("VmRSS:\t2000 kB\nVmHWM:\t3000 kB\n")
    (work / "gateway-metrics.txt").write_text('tollgate_requests_total{status="200"} 5\n')


def summarize(work, rounds, paths):
    out = subprocess.run([sys.executable, str(HERE / "summarize.py"), str(work), str(rounds), *paths],
                         capture_output=True, text=True, env={**os.environ, "SECTIONS": "fixed stream max maxstream"})
    return out


class Summarize(unittest.TestCase):
    def check(self, paths):
        with tempfile.TemporaryDirectory() as d:
            work = Path(d)
            fake_work(work, paths)
            out = summarize(work, 2, paths)
            self.assertEqual(out.returncode, 0, out.stderr)
            return out.stdout

    def test_every_path(self):
        text = self.check(["direct", "gateway", "gateway3", "nginx"])
        self.assertIn("### Streams, closed loop, 64 connections", text)
        # Printed with the fourth section as with the three it compares.
        self.assertIn("### Three deployments against one", text)

    def test_without_direct(self):
        # The reproduction: GATEWAY_PATHS without `direct` raised KeyError.
        text = self.check(["gateway", "nginx"])
        self.assertIn("One-shot, open loop", text)
        self.assertIn("gateway / nginx throughput", text)

    def test_telemetry_on_against_off(self):
        text = self.check(["gateway", "gateway-otel", "nginx"])
        self.assertIn("### Telemetry", text)
        # 1000 against 1040 responses/s: 3.8 % fewer.
        self.assertIn("-3.8 %", text)


if __name__ == "__main__":
    unittest.main()
