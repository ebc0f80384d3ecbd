"""A process exits cleanly right after its limiter was busy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_exiting_right_after_cancelling_a_limiters_waiters() -> None:
    """PY-2: 256 tasks waiting on a scope that refills every millisecond
    are cancelled at once and the process exits while wakes are still on
    their way: the interpreter shuts down without a crash or a fatal error
    (a wake handled during finalization used to take the GIL from the
    notifier thread and abort the process: one exit in five here). Thirty
    exits, two at a time."""
    worker = [sys.executable, str(HERE / "exit_worker.py"), "0.1"]
    for _ in range(15):
        pair = [subprocess.Popen(worker, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        for p in pair:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, f"exited with {p.returncode}; stderr:\n{err}"
            assert "Fatal Python error" not in err, err
