"""tollgate's exceptions (SPEC PY-6).

Every exception carries ``code``: the gateway's ``error.code`` for the same
situation (``crates/tollgate-gateway/src/error.rs``), so a program sees the
same codes whether it calls the engine in-process or through the gateway.
Where the gateway has no code of its own (a wrong argument, an unknown
scope, a missing token estimate), ``code`` is the engine's name for it.
"""

from __future__ import annotations

__all__ = [
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
]


class TollgateError(Exception):
    """Base class of every tollgate error.

    Attributes:
        code: the gateway's error code (e.g. ``"admission_rejected"``).
        status: the HTTP status the gateway answers with, if any.
        retry_after: seconds after which trying again may succeed, if known.
        message: the human-readable message.
    """

    code: str = "error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
        **details: object,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.status = status
        self.retry_after = retry_after
        for name, value in details.items():
            setattr(self, name, value)

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class ConfigError(TollgateError, ValueError):
    """An invalid configuration (keyword arguments or TOML), found before
    anything is admitted. ``kind`` is ``syntax``, ``schema``, ``invalid``,
    ``not_found`` or ``unreadable``; ``field`` the dotted setting (e.g.
    ``scopes.openai.rpm``); ``file``, ``line`` and ``column`` where it is."""

    code = "invalid_config"
    kind: str | None = None
    field: str | None = None
    file: str | None = None
    line: int | None = None
    column: int | None = None


class UnknownScope(TollgateError, KeyError):
    """The limiter has no scope of that name."""

    code = "unknown_scope"
    scope: str | None = None

    def __str__(self) -> str:  # KeyError would quote the message
        return TollgateError.__str__(self)


class AdmissionError(TollgateError):
    """Admission refused the call before any provider work."""


class AdmissionRejected(AdmissionError):
    """The scope's waiting queue, or a pool's waiting line, is full
    (gateway: 429 ``admission_rejected``)."""

    code = "admission_rejected"


class EstimateExceedsLimit(AdmissionError, ValueError):
    """The estimate is larger than a whole per-window limit: waiting cannot
    make it fit (gateway: 400 ``estimate_exceeds_limit``)."""

    code = "estimate_exceeds_limit"


class TokenEstimateRequired(AdmissionError, ValueError):
    """The scope limits tokens, so every call needs ``tokens=`` (or
    ``input_tokens=`` / ``output_tokens=``)."""

    code = "token_estimate_required"


class QuotaStoreUnavailable(AdmissionError):
    """The shared quota store does not answer and the scope fails closed
    (gateway: 503 ``quota_store_unavailable``)."""

    code = "quota_store_unavailable"


class Closed(AdmissionError):
    """The limiter is closed (gateway: 503 ``shutting_down``)."""

    code = "shutting_down"


class DeadlineExceeded(TollgateError, TimeoutError):
    """The call's one deadline ran out, or cannot be met. ``phase`` says
    where: ``queue``, ``cooldown``, ``rate``, ``concurrency`` (gateway: 429
    ``admission_wait_deadline_exceeded``, with ``retry_after``) or ``hook``,
    ``retry_delay``, ``transport``, ``stream`` (gateway: 504
    ``deadline_exceeded``). A quota further away than ``max_wait`` is the
    same code with ``phase`` ``rate``."""

    code = "deadline_exceeded"
    phase: str | None = None


class CircuitOpen(TollgateError):
    """The upstream's circuit is open; no attempt was made (gateway: 503
    ``circuit_open``)."""

    code = "circuit_open"


class UpstreamError(TollgateError):
    """The provider failed and the call gave up: ``upstream_rate_limited``,
    ``upstream_rejected``, ``upstream_timeout`` or ``upstream_error``.
    ``attempts`` says how many were made; the last attempt's exception, if
    one was raised, is the ``__cause__``."""

    code = "upstream_error"
    attempts: int | None = None


class AlreadySettled(TollgateError, RuntimeError):
    """This lease was already settled (each attempt settles once)."""

    code = "already_settled"
