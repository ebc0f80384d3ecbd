"""Shared helpers of the Python tests."""

from __future__ import annotations

import bisect
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest


@dataclass
class Record:
    """An independent record of admissions: for each admitted call, the
    instant before it asked and the instant after it was admitted (its
    reservation lies between), and what it was finally charged.

    ``over_limit(window, limit)`` finds a window that certainly held more
    than ``limit``: calls whose whole [asked, admitted] interval lies
    inside one window of length ``window`` were certainly admitted in it.
    """

    entries: list[tuple[float, float, int]] = field(default_factory=list)

    def add(self, asked: float, admitted: float, amount: int = 1) -> None:
        self.entries.append((asked, admitted, amount))

    def worst_window(self, window: float) -> int:
        """The largest amount certainly admitted within one window."""
        entries = sorted(self.entries)
        asks = [e[0] for e in entries]
        worst = 0
        for i, (start, _, _) in enumerate(entries):
            end = start + window
            stop = bisect.bisect_left(asks, end, lo=i)
            total = sum(a for (_, admitted, a) in entries[i:stop] if admitted < end)
            worst = max(worst, total)
        return worst


def now() -> float:
    return time.monotonic()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serves(port: int, pid: int) -> bool:
    """Whether the redis-server answering on `port` is process `pid`: a
    server another test suite started on the same port between
    `free_port()` and the spawn would otherwise pass for ours (which then
    exits, unable to bind)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"INFO server\r\n")
            reply = b""
            while len(reply) < 65536:
                chunk = s.recv(4096)
                if not chunk:
                    return False
                reply += chunk
                _, found, rest = reply.partition(b"\r\nprocess_id:")
                if found and b"\r\n" in rest:
                    return rest.split(b"\r\n", 1)[0].strip() == str(pid).encode()
    except OSError:
        pass
    return False


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server on a free loopback port without persistence, killed
    afterwards (another port is tried when one is taken before the server
    binds it); the test is skipped when redis-server is missing, unless
    TOLLGATE_REQUIRE_REDIS=1."""
    binary = shutil.which(os.environ.get("REDIS_SERVER", "redis-server"))
    if binary is None:
        if os.environ.get("TOLLGATE_REQUIRE_REDIS") == "1":
            pytest.fail("redis-server not found and TOLLGATE_REQUIRE_REDIS=1")
        pytest.skip("redis-server not found (set TOLLGATE_REQUIRE_REDIS=1 to fail instead)")
    for _ in range(5):
        port = free_port()
        server = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(tmp_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not serves(port, server.pid) and server.poll() is None:
            if time.monotonic() >= deadline:
                server.kill()
                server.wait()
                pytest.fail("redis-server did not answer within 10 s")
            time.sleep(0.02)
        if server.poll() is None:
            break
    else:
        pytest.fail("redis-server exited on five ports in a row")
    try:
        yield f"redis://127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait()
