"""The one classifier from an exception to a failure class (G8)."""

import httpx
import redis
from django.core.exceptions import ImproperlyConfigured
from django.db import InterfaceError, OperationalError

from runs.models.vocabulary import RETRYABLE_FAILURE_CLASSES, FailureClass

_CONNECTION_ERRORS = (
    ConnectionError,
    TimeoutError,
    httpx.TransportError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    OperationalError,
    InterfaceError,
)


def classify(error: BaseException) -> FailureClass:
    """Map ``error`` to its failure class.

    An exception may declare its class with a ``failure_class`` attribute
    (provider errors do). Anything unrecognised is ``unknown`` — not
    retryable — and that includes ``AuditPersistenceFailed`` on purpose (G3).
    The cause chain is not consulted: a write whose audit failed because the
    database dropped must not look like a retryable connection error.
    """
    declared = getattr(error, "failure_class", None)
    if declared is not None:
        try:
            return FailureClass(declared)
        except ValueError:
            return FailureClass.UNKNOWN
    if isinstance(error, ImproperlyConfigured):
        return FailureClass.CONFIGURATION
    if isinstance(error, _CONNECTION_ERRORS):
        return FailureClass.CONNECTION
    return FailureClass.UNKNOWN


def is_retryable(failure_class: str) -> bool:
    return failure_class in RETRYABLE_FAILURE_CLASSES
