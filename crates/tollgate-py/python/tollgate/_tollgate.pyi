"""Type stubs of tollgate's extension module (SPEC PY-6)."""

from __future__ import annotations

import datetime
import os
from collections.abc import Generator, Mapping
from types import TracebackType
from typing import Any, Literal

__version__: str

Seconds = float | int | datetime.timedelta

class Lease:
    """An admitted attempt; owns its reservation and concurrency permit."""

    @property
    def scope(self) -> str: ...
    @property
    def tokens(self) -> int:
        """Tokens reserved (input + output estimate)."""
    @property
    def settled(self) -> bool: ...
    @property
    def released(self) -> bool: ...
    @property
    def admission(self) -> dict[str, Any]:
        """``quota_wait`` and ``concurrency_wait`` (seconds), ``limited_by``
        (dimension names), ``cooldown`` and ``preemptions``."""
    def settle(
        self,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        *,
        total_tokens: int | None = None,
        usage: object | None = None,
    ) -> None:
        """Settles with the provider's reported usage (SPEC Q-5, Q-6);
        raises ``AlreadySettled`` the second time."""
    def refused(
        self,
        retry_after: Seconds | None = None,
        *,
        cost: Literal["full", "request", "free"] | None = None,
    ) -> None:
        """The provider answered 429: settle at the refusal's cost and cool
        the scope (SPEC Q-16, CD-1)."""
    def counted_by(self, seconds_ago: float = 0.0) -> None:
        """The provider counted the attempt by now (SPEC Q-15)."""
    def release(self) -> None:
        """Returns the concurrency permit (idempotent)."""
    def __enter__(self) -> Lease: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...

class Acquire:
    """The awaitable of ``Limiter.acquire``: ``await`` it for a lease, or
    ``async with`` it (the lease is released on exit)."""

    def __await__(self) -> Generator[Any, None, Lease]: ...
    async def __aenter__(self) -> Lease: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

class Pending:
    """An awaitable of a Rust future (e.g. ``Limiter.close()``)."""

    def __await__(self) -> Generator[Any, None, Any]: ...

class Limiter:
    """Request and token limits per named scope, never exceeded; a FIFO
    queue per scope; an optional concurrency limit; one deadline per call.
    Usable from several threads and event loops at once."""

    def __init__(
        self,
        scopes: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        concurrency: int | None = None,
        admission: Mapping[str, Any] | None = None,
        retry: Mapping[str, Any] | None = None,
        cooldown: Mapping[str, Any] | None = None,
        providers: Mapping[str, Mapping[str, Any]] | None = None,
        quota_store: Mapping[str, Any] | None = None,
        redis: str | None = None,
    ) -> None: ...
    @staticmethod
    def from_toml(path: str | os.PathLike[str], *, concurrency: int | None = None) -> Limiter: ...
    @staticmethod
    def from_toml_str(
        text: str, *, concurrency: int | None = None, origin: str = "<string>"
    ) -> Limiter: ...
    @property
    def scopes(self) -> list[str]: ...
    def acquire(
        self,
        scope: str,
        tokens: int | None = None,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        timeout: Seconds | None = None,
    ) -> Acquire: ...
    def acquire_blocking(
        self,
        scope: str,
        tokens: int | None = None,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        timeout: Seconds | None = None,
    ) -> Lease: ...
    def snapshot(self) -> dict[str, Any]: ...
    def close(self) -> Pending: ...
