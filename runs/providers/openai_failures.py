"""The one table from an OpenAI SDK error to the failure taxonomy (G8)."""

import math

import openai

from runs.models.vocabulary import FailureClass
from runs.providers.base import ProviderError

#: (how to recognise it, failure class), first match wins.
FAILURE_TABLE: list[tuple[str, object, str]] = [
    ("connection error or timeout", openai.APIConnectionError, FailureClass.CONNECTION),
    ("HTTP 429", 429, FailureClass.RATE_LIMIT),
    ("HTTP 401", 401, FailureClass.AUTH),
    ("HTTP 403", 403, FailureClass.AUTH),
    ("HTTP 400", 400, FailureClass.CLIENT_ERROR),
    ("HTTP 404", 404, FailureClass.CLIENT_ERROR),
    ("HTTP 422", 422, FailureClass.CLIENT_ERROR),
    ("HTTP 5xx", range(500, 600), FailureClass.SERVER_ERROR),
]


def _matches(rule, error: Exception) -> bool:
    status = getattr(error, "status_code", None)
    if isinstance(rule, type):
        return isinstance(error, rule)
    if isinstance(rule, int):
        return status == rule
    return status in rule


def _retry_after(error: Exception) -> float | None:
    response = getattr(error, "response", None)
    raw = response.headers.get("retry-after") if response is not None else None
    try:
        seconds = float(raw) if raw is not None else None
    except ValueError:
        return None  # an HTTP date; the exponential backoff applies
    # "inf" and "nan" parse too: no pause can be that long, the backoff applies.
    return max(0.0, seconds) if seconds is not None and math.isfinite(seconds) else None


def to_provider_error(error: Exception) -> ProviderError:
    """The ``ProviderError`` for an SDK error; ``unknown`` when no row matches."""
    for what, rule, failure_class in FAILURE_TABLE:
        if _matches(rule, error):
            return ProviderError(
                f"{what}: {error}",
                failure_class=failure_class,
                retry_after=_retry_after(error)
                if failure_class == FailureClass.RATE_LIMIT
                else None,
            )
    return ProviderError(f"unexpected provider error: {error}", failure_class=FailureClass.UNKNOWN)
