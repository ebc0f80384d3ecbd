"""`tollgate.testing.simulator`: the strict simulated provider in-process
(SPEC SIM-1, SIM-2, SIM-4)."""

from __future__ import annotations

import datetime

import httpx2
import pytest

from tollgate.testing import simulator


def test_simulator_enforces_its_limits_and_counts() -> None:
    """SIM-2, SIM-4: the in-process simulator answers OpenAI's chat
    completions, refuses past its limit with 429 and `retry-after`, and
    reports what it served and charged; settings are `tollgate sim`'s
    flags (durations in seconds, timedelta or text)."""
    with simulator(rpm=2, window=datetime.timedelta(seconds=30), completion_tokens=4, models=["a", "b"]) as sim:
        assert sim.openai_base_url == sim.base_url + "/v1"
        body = {"model": "a", "messages": [{"role": "user", "content": "abcd"}]}
        with httpx2.Client(base_url=sim.openai_base_url) as http:
            answers = [http.post("/chat/completions", json=body) for _ in range(3)]
            assert [a.status_code for a in answers] == [200, 200, 429]
            assert int(answers[2].headers["retry-after"]) > 0
            assert answers[0].json()["usage"] == {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}
            assert [m["id"] for m in http.get("/models").json()["data"]] == ["a", "b"]
        stats = sim.stats()
        assert stats["ok"] == 2 and stats["rejected_429"]["rpm"] == 1
        assert stats["tokens_charged"] == 22 and stats["limits"]["window_ms"] == 30_000
        sim.reset()
        assert sim.stats()["ok"] == 0
    sim.close()  # idempotent
    with pytest.raises(RuntimeError, match="stopped"):
        sim.stats()


def test_simulator_settings_are_validated() -> None:
    """SIM-2, CFG-1: a zero limit, an unknown setting or a bad duration is
    refused with the simulator's own message."""
    with pytest.raises(ValueError, match="rpm"):
        simulator(rpm=0)
    with pytest.raises(ValueError, match="--speed"):
        simulator(speed=3)
    with pytest.raises(ValueError, match="duration"):
        simulator(window="soon")
    with simulator(window=0.5, ttft="5ms") as sim:
        assert sim.stats()["limits"]["window_ms"] == 500


def test_simulator_takes_its_rates_and_durations_as_numbers() -> None:
    """SIM-2: the fault rates are plain fractions (`--error-rate 0.1`), not
    durations; every duration, `ingress_delay` included, is seconds (an
    `int` or a `float`), a timedelta or the flag's text."""
    refused = {}
    for settings in (
        {"error_rate": 0.1},
        {"disconnect_rate": 0.05},
        {"slow_headers_rate": 0.2},
        {"ingress_delay": 1},
        {"ingress_delay": datetime.timedelta(milliseconds=5)},
        {"ingress_delay": (0.001, 0.002)},
    ):
        try:
            with simulator(**settings):
                pass
        except ValueError as e:
            refused[str(settings)] = str(e).splitlines()[0]
    assert not refused, refused
    with pytest.raises(ValueError, match="durations"):
        simulator(ingress_delay=-1)
    with simulator(error_rate=1.0, window=1) as sim:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        with httpx2.Client(base_url=sim.openai_base_url) as http:
            assert http.post("/chat/completions", json=body).status_code in (500, 503)
