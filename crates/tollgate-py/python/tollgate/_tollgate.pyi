"""Type stubs of tollgate's extension module (SPEC PY-6)."""

from __future__ import annotations

import datetime
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping
from types import TracebackType
from typing import Any, Literal, TypeVar

T = TypeVar("T")

__version__: str
__optimised__: bool

Seconds = float | int | datetime.timedelta

class Lease:
    """An admitted attempt; owns its reservation and concurrency permit."""

    @property
    def scope(self) -> str: ...
    @property
    def tokens(self) -> int:
        """Tokens reserved (input + output estimate)."""
    @property
    def settled(self) -> bool:
        """Whether it was settled (``settle`` or ``refused``); a lease
        released without a settlement stays unsettled (its whole estimate
        counted, SPEC Q-5)."""
    @property
    def released(self) -> bool:
        """Whether its permit was returned."""
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
        raises ``AlreadySettled`` the second time, and ``RuntimeError``
        once the lease was released unsettled (it keeps its estimate)."""
    def refused(
        self,
        retry_after: Seconds | None = None,
        *,
        cost: Literal["full", "request", "free"] | None = None,
    ) -> None:
        """The provider answered 429: settle at the refusal's cost and cool
        the scope (SPEC Q-16, CD-1); raises as ``settle`` does."""
    def counted_by(self, seconds_ago: float = 0.0) -> None:
        """The provider counted the attempt by now (SPEC Q-15)."""
    def release(self) -> None:
        """Returns the concurrency permit (idempotent); an unsettled lease
        keeps its whole estimate and can no longer be settled."""
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
    def call(
        self,
        func: Callable[..., Awaitable[T] | T],
        /,
        *args: Any,
        scope: str | None = None,
        tokens: int | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        timeout: Seconds | None = None,
        idempotent: bool = True,
        usage: Callable[[Any], object | None] | None = None,
        provider: str | None = None,
    ) -> Awaitable[T]:
        """Runs ``func(*args)`` under the supervised lifecycle (SPEC PY-3):
        admission, retries with jitter and hint floors, circuit breaker,
        cooldown, one deadline; settles from the result's usage."""
    def stream(
        self,
        func: Callable[..., Any],
        /,
        *args: Any,
        scope: str | None = None,
        tokens: int | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        timeout: Seconds | None = None,
        idempotent: bool = True,
        usage: Callable[[Any], object | None] | None = None,
        provider: str | None = None,
    ) -> SupervisedStream:
        """``func(*args)`` returns an async iterable (or an awaitable of
        one): its items as a supervised stream (SPEC PY-3, LC-3)."""
    def snapshot(self) -> dict[str, Any]: ...
    def close(self) -> Pending: ...

class SupervisedStream:
    """The async iterator of ``Limiter.stream``; ``aclose()`` (or leaving
    ``async with``) ends it early, its opening included, and returns once
    an ``__anext__`` in flight has let go of it and the upstream work it
    cut has unwound: its capacity is back then."""

    def __aiter__(self) -> SupervisedStream: ...
    def __anext__(self) -> Awaitable[Any]: ...
    def aclose(self) -> Awaitable[None]: ...
    async def __aenter__(self) -> SupervisedStream: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

class TransportCore:
    """The Rust side of ``tollgate.AsyncTransport`` / ``tollgate.Transport``."""

    def __init__(
        self,
        limiter: Limiter,
        scope: str | None = None,
        *,
        flavor: str | None = None,
        provider: str | None = None,
        timeout: Seconds | None = None,
        default_max_tokens: int | None = None,
        blocking: bool = False,
    ) -> None: ...
    @property
    def scope(self) -> str: ...
    def handle(self, request: Any, kit: Any) -> Awaitable[Any]: ...
    def handle_blocking(self, request: Any, kit: Any) -> Any: ...

class ResponseBody:
    """A streamed answer's bytes (read by the transports' byte streams)."""

    def next(self) -> Awaitable[bytes | None]: ...
    def next_blocking(self) -> bytes | None: ...
    def aclose(self) -> Awaitable[None]: ...
    def close(self) -> None: ...

class SimulatorServer:
    """A running simulated provider (see ``tollgate.testing``)."""

    def __init__(self, flags: list[str]) -> None: ...
    @property
    def base_url(self) -> str: ...
    @property
    def openai_base_url(self) -> str: ...
    def stats_json(self) -> str: ...
    def reset(self) -> None: ...
    def stop(self) -> None: ...
