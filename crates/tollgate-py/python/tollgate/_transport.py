"""httpx transports that put tollgate's engine under the OpenAI and
Anthropic SDKs (SPEC PY-4).

Everything that decides (routing, estimating, admitting, retrying,
settling, reading rate-limit headers and stream events) happens in Rust
(``TransportCore``); this module only adapts it to httpx's transport
interface, for ``httpx`` and ``httpx2`` alike (the current SDKs use
``httpx2``; the answer is built with the module the request came from).
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ._tollgate import Limiter, TransportCore

__all__ = ["AsyncTransport", "Transport", "httpx_client"]


def _modules() -> list[Any]:
    found = []
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name))
        except ImportError:
            pass
    return found


_MODULES = _modules()
if not _MODULES:  # pragma: no cover - httpx ships with every SDK
    raise ImportError("tollgate's transports need httpx2 or httpx")


def _module_of(obj: object) -> Any:
    root = type(obj).__module__.split(".", 1)[0]
    for mod in _MODULES:
        if mod.__name__ == root:
            return mod
    raise TypeError(f"not an httpx or httpx2 object: {type(obj).__name__}")


class _AsyncBody(*(m.AsyncByteStream for m in _MODULES)):  # type: ignore[misc]
    """A streamed answer's bytes, read from the engine's stream."""

    def __init__(self, body: Any) -> None:
        self._body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        body = self._body
        while (chunk := await body.next()) is not None:
            yield chunk

    async def aclose(self) -> None:
        await self._body.aclose()


class _SyncBody(*(m.SyncByteStream for m in _MODULES)):  # type: ignore[misc]
    """A streamed answer's bytes, read from the engine's stream."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def __iter__(self) -> Iterator[bytes]:
        body = self._body
        while (chunk := body.next_blocking()) is not None:
            yield chunk

    def close(self) -> None:
        self._body.close()


class _Kit:
    """What the engine needs of one httpx module."""

    __slots__ = ("Request", "Response", "Body", "inner", "owned")

    def __init__(self, mod: Any, body: type, inner: Any, owned: bool) -> None:
        self.Request = mod.Request
        self.Response = mod.Response
        self.Body = body
        self.inner = inner
        self.owned = owned


class _Base:
    def __init__(
        self,
        limiter: Limiter,
        scope: str | None,
        transport: Any,
        flavor: str | None,
        provider: str | None,
        timeout: float | None,
        default_max_tokens: int | None,
        blocking: bool,
    ) -> None:
        self._core = TransportCore(
            limiter,
            scope,
            flavor=flavor,
            provider=provider,
            timeout=timeout,
            default_max_tokens=default_max_tokens,
            blocking=blocking,
        )
        self._given = transport
        self._kits: dict[str, _Kit] = {}

    @property
    def scope(self) -> str:
        """The scope every model call spends."""
        return self._core.scope

    def _kit(self, request: Any) -> _Kit:
        mod = _module_of(request)
        kit = self._kits.get(mod.__name__)
        if kit is None:
            kit = self._new_kit(mod)
            self._kits[mod.__name__] = kit
        return kit

    def _new_kit(self, mod: Any) -> _Kit:  # pragma: no cover - overridden
        raise NotImplementedError


class AsyncTransport(_Base, *(m.AsyncBaseTransport for m in _MODULES)):  # type: ignore[misc]
    """An async httpx transport that admits, estimates, retries and settles
    every model call of an SDK client through ``limiter`` (SPEC PY-4)::

        client = openai.AsyncOpenAI(
            http_client=httpx2.AsyncClient(transport=tollgate.AsyncTransport(limiter, "openai")),
            max_retries=0,
        )

    ``scope``: the quota scope calls spend (optional when the limiter has
    one). ``transport``: the transport requests go out through (default: a
    new ``AsyncHTTPTransport`` of the request's httpx module). ``flavor``
    (``openai``, ``azure``, ``openai_compatible``, ``anthropic``) or
    ``provider`` (a ``[providers.*]`` table of the limiter's configuration)
    says how the provider counts (default: Anthropic's profile for
    ``/v1/messages``, OpenAI's character rule for the other APIs).
    ``timeout``: each call's deadline in seconds (default ``[admission]
    default_timeout``, 60 s; a request's ``x-request-timeout`` header
    overrides it up to ``max_timeout``). ``default_max_tokens``: the output
    allowance of a request that sets none (default 1024).

    Requests other than ``POST`` to chat completions, embeddings,
    Responses (paths ending with ``/chat/completions``, ``/embeddings``,
    ``/responses``) and Anthropic's Messages (``/v1/messages``) pass
    through unadmitted, OpenAI's ``/threads/{id}/messages`` among them. Every answer that ends
    a call carries ``x-should-retry: false``: the engine has retried
    already, the SDK must not."""

    def __init__(
        self,
        limiter: Limiter,
        scope: str | None = None,
        *,
        transport: Any = None,
        flavor: str | None = None,
        provider: str | None = None,
        timeout: float | None = None,
        default_max_tokens: int | None = None,
    ) -> None:
        _Base.__init__(
            self, limiter, scope, transport, flavor, provider, timeout, default_max_tokens, False
        )

    def _new_kit(self, mod: Any) -> _Kit:
        if self._given is not None:
            return _Kit(mod, _AsyncBody, self._given, False)
        return _Kit(mod, _AsyncBody, mod.AsyncHTTPTransport(), True)

    async def handle_async_request(self, request: Any) -> Any:
        await request.aread()
        return await self._core.handle(request, self._kit(request))

    async def aclose(self) -> None:
        if self._given is not None:
            await self._given.aclose()
        for kit in self._kits.values():
            if kit.owned:
                await kit.inner.aclose()


class Transport(_Base, *(m.BaseTransport for m in _MODULES)):  # type: ignore[misc]
    """The synchronous counterpart of ``AsyncTransport`` (for
    ``openai.OpenAI`` / ``anthropic.Anthropic`` over ``httpx2.Client``):
    each call waits on the calling thread, without the GIL."""

    def __init__(
        self,
        limiter: Limiter,
        scope: str | None = None,
        *,
        transport: Any = None,
        flavor: str | None = None,
        provider: str | None = None,
        timeout: float | None = None,
        default_max_tokens: int | None = None,
    ) -> None:
        _Base.__init__(
            self, limiter, scope, transport, flavor, provider, timeout, default_max_tokens, True
        )

    def _new_kit(self, mod: Any) -> _Kit:
        if self._given is not None:
            return _Kit(mod, _SyncBody, self._given, False)
        return _Kit(mod, _SyncBody, mod.HTTPTransport(), True)

    def handle_request(self, request: Any) -> Any:
        request.read()
        return self._core.handle_blocking(request, self._kit(request))

    def close(self) -> None:
        if self._given is not None:
            self._given.close()
        for kit in self._kits.values():
            if kit.owned:
                kit.inner.close()


def httpx_client(
    limiter: Limiter,
    scope: str | None = None,
    *,
    sync: bool = False,
    module: Any = None,
    flavor: str | None = None,
    provider: str | None = None,
    timeout: float | None = None,
    default_max_tokens: int | None = None,
    **client_options: Any,
) -> Any:
    """An httpx client whose every model call goes through ``limiter``: an
    ``AsyncClient`` (or a ``Client`` with ``sync=True``) of ``module``
    (default ``httpx2``, which both SDKs accept; else ``httpx``) over
    ``AsyncTransport`` / ``Transport``. ``client_options`` go to the
    client (e.g. ``base_url``, ``headers``); the transport options are
    ``AsyncTransport``'s::

        client = openai.AsyncOpenAI(http_client=tollgate.httpx_client(limiter, "openai"))
    """
    mod = module if module is not None else _MODULES[0]
    options = dict(flavor=flavor, provider=provider, timeout=timeout, default_max_tokens=default_max_tokens)
    if sync:
        return mod.Client(transport=Transport(limiter, scope, **options), **client_options)
    return mod.AsyncClient(transport=AsyncTransport(limiter, scope, **options), **client_options)
