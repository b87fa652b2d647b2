"""Exceptions that stop an execution, and what each means for the run."""


class AuditPersistenceFailed(Exception):
    """A write tool executed but its step could not be persisted (G2).

    Deliberately carries no ``failure_class``: the classifier maps it to
    ``unknown``, which is not retryable, so the write is never re-executed by
    an automatic retry (G3).
    """


class LeaseLost(Exception):
    """The run is no longer this worker's (reaped, re-claimed or settled).

    The worker stops at once and settles nothing (G5).
    """


class RunCancelled(Exception):
    """An operator asked to cancel; noticed at a step boundary (G9)."""


class StepsNotDurable(Exception):
    """A write was about to start while earlier steps of the run could not be
    recorded (G12): it does not start. No write has run since the last
    durable step, so the attempt may be retried: it resumes after that step.
    """

    failure_class = "connection"
