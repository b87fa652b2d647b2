"""Exceptions that stop an execution, and what each means for the run."""


class AuditPersistenceFailed(Exception):
    """A write tool executed but its step could not be persisted (G2).

    Deliberately carries no ``failure_class``: the classifier maps it to
    ``unknown``, which is not retryable, so the write is never re-executed by
    an automatic retry (G3). ``call`` is the fenced call (tool, arguments,
    idempotency key), for the fence to say that its audit failed.
    """

    def __init__(self, message: str, *, call: dict | None = None):
        super().__init__(message)
        self.call = call


class WriteOutcomeUnknown(Exception):
    """A write tool ran and nobody can tell whether its write took effect
    (G13): it raised ``ToolOutcomeUnknown``, was stopped at its time limit,
    or failed in a way it did not report as a ``ToolError``.

    The attempt stops with the write's fence standing, and its outcome is
    not recorded: the model is told nothing. Class ``connection``, so an
    ``idempotent_write`` is retried (the resumed attempt runs the call again
    with the same idempotency key) while a ``non_idempotent_write`` — whose
    fence forbids any retry (G8) — is dead-lettered ``write_interrupted``
    for an operator to reconcile.
    """

    failure_class = "connection"

    def __init__(self, message: str, *, effect: str):
        super().__init__(message)
        self.effect = effect


class LeaseLost(Exception):
    """The run is no longer this worker's (reaped, re-claimed or settled).

    The worker stops at once and settles nothing (G5).
    """


class RunCancelled(Exception):
    """An operator asked to cancel; noticed at a step boundary (G9)."""


class StepsNotDurable(Exception):
    """The attempt cannot go on without a gap in the journal (G12): a write
    was about to start while earlier steps of the run could not be recorded
    (it does not start), or steps it had recorded are gone (a database server
    crash lost commits that had not reached disk). No write of the attempt
    is among what is not durable — that is ``WriteNotDurable`` — so the
    attempt may be retried: it resumes after the last durable step.
    """

    failure_class = "connection"


class WriteNotDurable(Exception):
    """A write ran in this attempt and its record is not on the database
    for certain: the database lost it, or the commits before it that the
    attempt counted on (its fence's among them — a server that did not
    honour the flush, a failover), or it cannot be told whether it landed.
    Nothing in the database may show the write any more, so the attempt's
    own knowledge of the call (``write``: effect, tool, arguments,
    idempotency key) is what stands on the run as its write in question.

    Deliberately carries no ``failure_class`` (so ``unknown``): the run is
    dead-lettered ``write_interrupted`` whatever the write's effect, and
    never retried, since a retry would resume before the write and could
    send it again (G6, G12, G13).
    """

    def __init__(self, message: str, *, write: dict):
        super().__init__(message)
        self.write = write


class AwaitingApproval(Exception):
    """The run is parked ``waiting_for_approval`` (G14): a call of its turn
    needs an operator's decision. The attempt is over; its lease is released
    and nothing is settled. ``approvals``: the requests created."""

    def __init__(self, approvals: list):
        super().__init__(f"{len(approvals)} call(s) wait for approval")
        self.approvals = approvals


class AwaitingInput(Exception):
    """The run is parked ``waiting_for_input`` (G24): a call waits for a
    person's answer or another system's completion. The attempt is over;
    its lease is released and nothing is settled."""

    def __init__(self, request):
        super().__init__(f"{request.tool_name} waits for {request.kind}")
        self.request = request


class BudgetExhausted(Exception):
    """Another model call would go over the run's limit or its submitter's
    budget (G17). Checked before the call, never during a tool: the run
    ends ``failed``/``budget_exhausted`` (a queued run with a dead letter),
    not retryable. ``where``: ``run`` or ``submitter``."""

    def __init__(self, message: str, *, where: str):
        super().__init__(message)
        self.where = where
