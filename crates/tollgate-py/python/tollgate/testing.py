"""Testing helpers: the strict simulated provider in-process.

``simulator(**settings)`` starts tollgate's simulated provider (the one
``tollgate sim`` runs, SPEC §14) on a free loopback port, in this process,
so code that calls OpenAI- or Anthropic-style APIs can be tested against a
provider that enforces its limits exactly and counts what it served::

    from tollgate.testing import simulator

    with simulator(rpm=60, tpm=10_000, window=10) as sim:
        client = openai.OpenAI(base_url=sim.openai_base_url, api_key="test")
        ...
        assert sim.stats()["rejected_429"] == {...all zero...}

Settings are ``tollgate sim``'s flags as keyword arguments (``--rpm 60``
is ``rpm=60``): ``rpm``, ``tpm``, ``max_concurrency``, ``window``,
``ttft``, ``per_token``, ``completion_tokens``, ``seed``, ``error_rate``,
``disconnect_rate``, ``slow_headers_rate``, ``slow_headers_delay``,
``require_key``, ``models`` (a list), ``ingress_delay``, ``charge``,
``reconcile``, ``charge_refusals``, ``background_rpm``,
``background_tpm``, ``azure_key``, ``anthropic_key``, ``anthropic_rpm``,
``itpm``, ``otpm``. Durations (``window``, ``ttft``, ``per_token``,
``slow_headers_delay``, ``ingress_delay``) are seconds (``int``/``float``),
a ``timedelta`` or the flag's text (``"500ms"``); ``ingress_delay`` may
also be a ``(min, max)`` pair (``"20ms..300ms"``). Rates
(``error_rate=0.1``) and limits are plain numbers.
"""

from __future__ import annotations

import datetime
import json
from types import TracebackType
from typing import Any

from ._tollgate import SimulatorServer

__all__ = ["Simulator", "simulator"]


_DURATIONS = {"window", "ttft", "per_token", "slow_headers_delay", "ingress_delay"}


def _duration(name: str, value: Any) -> str:
    """A duration setting as the flag's text: seconds (``int``/``float``)
    or a ``timedelta`` in microseconds; text as it is."""
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not (0 <= value < float("inf")):
            raise ValueError(f"{name}: durations must be finite and >= 0 seconds, got {value}")
        return f"{round(value * 1_000_000)}us"
    return str(value)


def _flag_value(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if name in _DURATIONS:
        if name == "ingress_delay" and isinstance(value, tuple):
            if len(value) != 2:
                raise ValueError(f"ingress_delay: a (min, max) pair, got {value!r}")
            low, high = value
            return f"{_duration(name, low)}..{_duration(name, high)}"
        return _duration(name, value)
    # Numbers (limits, rates such as error_rate=0.1) and text as they are.
    return str(value)


def _flags(settings: dict[str, Any]) -> list[str]:
    flags: list[str] = []
    for name, value in settings.items():
        if value is None:
            continue
        if name == "models":
            if isinstance(value, str):
                value = [value]
            for model in value:
                flags += ["--model", str(model)]
            continue
        flags += ["--" + name.replace("_", "-"), _flag_value(name, value)]
    return flags


class Simulator:
    """A running simulated provider; use it as a (async) context manager,
    or call ``close()``."""

    def __init__(self, **settings: Any) -> None:
        self._server = SimulatorServer(_flags(settings))

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``: the Anthropic SDK's ``base_url``."""
        return self._server.base_url

    @property
    def openai_base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``: the OpenAI SDK's ``base_url``."""
        return self._server.openai_base_url

    def url(self, path: str) -> str:
        """``base_url`` followed by ``path``."""
        return self.base_url + path

    def stats(self) -> dict[str, Any]:
        """The simulator's counters (``GET /stats``, SPEC SIM-4): ``ok``,
        ``rejected_429`` by cause, ``requests_charged``, ``tokens_charged``,
        ``max_requests_in_window``, ``max_tokens_in_window``, the
        Anthropic buckets' charges, faults, ``limits``..."""
        return json.loads(self._server.stats_json())

    def reset(self) -> None:
        """Clears counters, windows and the fault sequence."""
        self._server.reset()

    def close(self) -> None:
        """Stops the simulator (requests in progress finish). Idempotent."""
        self._server.stop()

    def __enter__(self) -> Simulator:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Simulator:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def simulator(**settings: Any) -> Simulator:
    """Starts the simulated provider with ``settings`` (see the module
    documentation) and returns it."""
    return Simulator(**settings)
