"""tollgate: exact, cancel-safe, token-aware admission for rate-limited LLM
APIs, on the same Rust engine as tollgate's gateway (SPEC §17).

```python
import tollgate

limiter = tollgate.Limiter(scopes={"openai": {"rpm": 500, "tpm": 200_000}})
async with limiter.acquire("openai", tokens=1200, timeout=30) as lease:
    resp = await client.chat.completions.create(...)
    lease.settle(usage=resp.usage)
```

See docs/python.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._errors import (
    AdmissionError,
    AdmissionRejected,
    AlreadySettled,
    CircuitOpen,
    Closed,
    ConfigError,
    DeadlineExceeded,
    EstimateExceedsLimit,
    ProviderError,
    QuotaStoreUnavailable,
    TokenEstimateRequired,
    TollgateError,
    UnknownScope,
    UpstreamError,
)
from ._tollgate import Lease, Limiter, SupervisedStream, __version__

if TYPE_CHECKING:
    from ._transport import AsyncTransport, Transport, httpx_client

# The SDK transports need httpx (or httpx2), which every SDK brings but
# the package itself does not require: they are imported on first use, so
# `import tollgate` works without them (PY-1) and a transport without
# httpx raises ImportError saying so.
_TRANSPORTS = ("AsyncTransport", "Transport", "httpx_client")


def __getattr__(name: str) -> Any:
    if name in _TRANSPORTS:
        from . import _transport

        return getattr(_transport, name)
    raise AttributeError(f"module 'tollgate' has no attribute {name!r}")


__all__ = [
    "Limiter",
    "Lease",
    "SupervisedStream",
    "AsyncTransport",
    "Transport",
    "httpx_client",
    "TollgateError",
    "ConfigError",
    "UnknownScope",
    "AdmissionError",
    "AdmissionRejected",
    "EstimateExceedsLimit",
    "TokenEstimateRequired",
    "QuotaStoreUnavailable",
    "Closed",
    "DeadlineExceeded",
    "CircuitOpen",
    "UpstreamError",
    "ProviderError",
    "AlreadySettled",
    "__version__",
]
