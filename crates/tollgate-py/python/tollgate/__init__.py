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

from ._errors import (
    AdmissionError,
    AdmissionRejected,
    AlreadySettled,
    CircuitOpen,
    Closed,
    ConfigError,
    DeadlineExceeded,
    EstimateExceedsLimit,
    QuotaStoreUnavailable,
    TokenEstimateRequired,
    TollgateError,
    UnknownScope,
    UpstreamError,
)
from ._tollgate import Lease, Limiter, __version__

__all__ = [
    "Limiter",
    "Lease",
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
    "AlreadySettled",
    "__version__",
]
