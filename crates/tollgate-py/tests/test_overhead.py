"""The overhead of acquire + settle from Python (SPEC PY-7), with the
operations of benches/python/overhead.py (whose full run, next to
aiolimiter, gives the figures in BENCHMARKS.md)."""

from __future__ import annotations

import importlib.util
import pathlib
import statistics

BENCH = pathlib.Path(__file__).resolve().parents[3] / "benches" / "python" / "overhead.py"
spec = importlib.util.spec_from_file_location("overhead_bench", BENCH)
assert spec and spec.loader
overhead = importlib.util.module_from_spec(spec)
spec.loader.exec_module(overhead)

BOUND_NS = 25_000  # PY-7: at most 25 µs at the median
OPS = 20_000


async def test_acquire_and_settle_median_within_25_microseconds() -> None:
    """PY-7: one acquire + settle (a request and a token limit, settled
    with the reported usage) costs at most 25 µs at the median, alone and
    with 1,000 tasks in flight on the loop; aiolimiter's acquire is timed
    in the same run. (Measured: about 2 µs, BENCHMARKS.md; the margin
    absorbs a loaded CI machine, and a median ignores preemptions.)"""
    for run in (overhead.uncontended, overhead.contended):
        limiter, aio = overhead.limiters()
        samples, _ = await run(overhead.tollgate_op, limiter, OPS)
        theirs, _ = await run(overhead.aiolimiter_op, aio, OPS)
        assert len(samples) == OPS and len(theirs) == OPS
        median = statistics.median(samples)
        assert median <= BOUND_NS, f"{run.__name__}: median {median / 1000:.2f} µs (aiolimiter {statistics.median(theirs) / 1000:.2f} µs)"
        snapshot = limiter.snapshot()
        assert snapshot["idle"]
        assert snapshot["scopes"]["openai"]["counters"]["admitted"] == OPS + (2_000 if run is overhead.uncontended else 0)
