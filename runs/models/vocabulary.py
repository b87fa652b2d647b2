"""The values a run, a step and a dead letter can take (DESIGN.md §2), and
what an operator's action answers.

Each status names the transition in ``runs.transitions`` that writes it; that
module is the only writer of a run's status.
"""

from dataclasses import dataclass

from django.db import models


class RunStatus(models.TextChoices):
    # create_queued_run, requeue_for_retry, reap_requeue, note_redispatch (stays queued),
    # operator_requeue, operator_restart
    QUEUED = "queued"  # … and decide_approval, when the last pending call is decided
    RUNNING = "running"  # claim, begin_interactive
    #: Not terminal: its turn asked for a call that needs an operator's
    #: approval (G14). It holds no lease and no worker. wait_for_approval
    #: writes it; decide_approval, expire_approvals and cancel end it.
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    #: Not terminal: a call of its turn waits for a person's answer (the
    #: ``ask_person`` tool) or for another system to complete it (a
    #: deferred tool), G24. No lease, no worker, as for an approval.
    #: wait_for_input writes it; answer_call, expire_waits and cancel end it.
    WAITING_FOR_INPUT = "waiting_for_input"
    COMPLETED = "completed"  # settle, finish
    # settle, dead_letter, fail_dispatch, reap_dead_letter, reap_abandoned, expire_approvals
    FAILED = "failed"
    CANCELLED = "cancelled"  # cancel, settle, finish, reap_cancelled

    @classmethod
    def terminal(cls) -> set[str]:
        return {cls.COMPLETED, cls.FAILED, cls.CANCELLED}

    @classmethod
    def waiting(cls) -> tuple[str, str]:
        """The statuses of a run parked for someone outside the worker: it
        holds no lease, the reaper's lease checks leave it alone, a cancel
        ends it at once."""
        return (cls.WAITING_FOR_APPROVAL, cls.WAITING_FOR_INPUT)


class TerminationReason(models.TextChoices):
    """Why a run ended; the status says what."""

    COMPLETED = "completed"
    MAX_ITERATIONS = "max_iterations"
    CANCELLED = "cancelled"
    PROVIDER_FAILED = "provider_failed"
    NOT_RETRYABLE = "not_retryable"
    RETRIES_EXHAUSTED = "retries_exhausted"
    WRITE_INTERRUPTED = "write_interrupted"
    AUDIT_FAILED = "audit_failed"
    DISPATCH_FAILED = "dispatch_failed"
    LEASE_LOST_NO_REQUEST = "lease_lost_no_request"
    #: A resumed attempt found a journal it cannot replay without
    #: improvising (a recorded tool gone or disabled, a request that no
    #: longer parses, a gap): it stops rather than contradict the world.
    JOURNAL_UNREPLAYABLE = "journal_unreplayable"
    #: An interactive run whose caller stopped renewing its lease (its
    #: process died or was stopped): the reaper ends it, never a worker.
    ABANDONED = "abandoned"
    #: A call waited for an operator's decision longer than
    #: ``NRLLM_APPROVAL_TIMEOUT_SECONDS``; the reaper ends the run.
    APPROVAL_EXPIRED = "approval_expired"
    #: Another model call would have passed the run's limit
    #: (``max_total_tokens``, ``max_cost``) or its submitter's budget (G17).
    BUDGET_EXHAUSTED = "budget_exhausted"
    #: A deferred ``non_idempotent_write`` was not completed by its
    #: deadline: it was handed on, so it is in doubt (G13, G24), never retried.
    COMPLETION_EXPIRED = "completion_expired"


class FailureClass(models.TextChoices):
    CONNECTION = "connection"
    RATE_LIMIT = "rate_limit"
    AUTH = "auth"
    CONFIGURATION = "configuration"
    CLIENT_ERROR = "client_error"
    SERVER_ERROR = "server_error"
    CIRCUIT_OPEN = "circuit_open"
    UNKNOWN = "unknown"


RETRYABLE_FAILURE_CLASSES = frozenset(
    {
        FailureClass.CONNECTION,
        FailureClass.RATE_LIMIT,
        FailureClass.SERVER_ERROR,
        FailureClass.CIRCUIT_OPEN,
    }
)


class RunMode(models.TextChoices):
    QUEUED = "queued"  # enqueue(): executed by a worker
    #: run(): executed inline by the caller — until an operator requeues or
    #: restarts it (operator_requeue), which makes it a queued run.
    INTERACTIVE = "interactive"


class StepKind(models.TextChoices):
    REQUEST = "request"
    LLM = "llm"
    TOOL = "tool"
    OPERATOR = "operator"
    REAPER = "reaper"
    #: A re-executed attempt replayed the journal: what it replayed, where it went live.
    RESUME = "resume"
    #: A call that needs approval was asked for (the run waits), or an
    #: operator decided it, or it expired or was withdrawn (G14).
    APPROVAL = "approval"
    #: A call waits for a person's answer or another system's completion,
    #: or got it, or its wait expired (G24). The call's outcome is its
    #: ``tool`` step, recorded with it.
    INPUT = "input"
    #: A write the run stopped counting on at its time limit finished after
    #: all, in a worker thread that could not stop it: what it returned (G15).
    LATE_RESULT = "late_result"


class DeadLetterReason(models.TextChoices):
    NOT_RETRYABLE = "not_retryable"
    RETRIES_EXHAUSTED = "retries_exhausted"
    WRITE_INTERRUPTED = "write_interrupted"
    JOURNAL_UNREPLAYABLE = "journal_unreplayable"
    #: Its wake-up job could not be enqueued for a reason that trying again
    #: would not cure (a configuration error, say); a connection failure
    #: leaves the run queued for the reaper to dispatch again instead.
    DISPATCH_FAILED = "dispatch_failed"
    #: Stopped before a model call that would have gone over a limit (G17).
    BUDGET_EXHAUSTED = "budget_exhausted"
    #: A deferred ``non_idempotent_write`` not completed by its deadline (G24).
    COMPLETION_EXPIRED = "completion_expired"


class Resolution(models.TextChoices):
    """How an operator closed a dead letter."""

    REQUEUED = "requeued"
    DISMISSED = "dismissed"
    RECONCILED = "reconciled"


class ReconciliationOutcome(models.TextChoices):
    APPLIED = "applied"  # the write landed: running the run again would repeat it
    NOT_APPLIED = "not_applied"  # it did not: the run may be requeued


class ApprovalStatus(models.TextChoices):
    """Where one call's approval request stands (G14)."""

    PENDING = "pending"  # wait_for_approval
    APPROVED = "approved"  # decide_approval: the call executes, once, as approved
    DENIED = "denied"  # decide_approval: the model is told; the call never executes
    EXPIRED = "expired"  # expire_approvals: nobody decided in time; the run failed
    WITHDRAWN = "withdrawn"  # cancel: the run was cancelled while it waited
    #: edit_approval: a person edited the call; a new request (``replaces``
    #: naming this one) waits for its own approval (G24).
    REPLACED = "replaced"
    #: answer_call: a question answered, or a deferred call completed; its
    #: outcome is the call's tool step.
    ANSWERED = "answered"


#: The requests that hold their call's place: one per call of a turn.
LIVE_REQUEST_STATUSES = (
    ApprovalStatus.PENDING,
    ApprovalStatus.APPROVED,
    ApprovalStatus.DENIED,
    ApprovalStatus.ANSWERED,
)


class WaitKind(models.TextChoices):
    """What a waiting call waits for (``ApprovalRequest.kind``)."""

    #: An operator's approval (G14): the run waits ``waiting_for_approval``.
    APPROVAL = "approval"
    #: A person's answer to the agent's question (``ask_person``, G24).
    QUESTION = "question"
    #: Another system's completion of a deferred tool's call (G24).
    DEFERRED = "deferred"


class SubmittedVia(models.TextChoices):
    """How a run was submitted (``AgentRun.submitted_via``)."""

    API = "api"  # POST /api/runs/: the token's (or the session's) user
    CONSOLE = "console"  # the admin's "Start a run" form: the operator
    COMMAND_LINE = "command_line"  # manage.py enqueue_run / run_agent / seed_demo
    SCHEDULE = "schedule"  # a schedule's firing or backfill: its owner, or who backfilled
    TRIGGER = "trigger"  # a signed event: the trigger's owner


@dataclass(frozen=True)
class ActionResult:
    """What an operator's action answers, whichever action it was.

    Operator actions (``runs.operators.actions``) and approval decisions
    (``runs.approvals.actions``) answer in this one shape: the admin shows
    its ``detail`` as a message, the API maps ``ok`` to 200 or 409 with
    ``code`` in the body. It sits below both so that neither imports the
    other."""

    ok: bool
    #: Machine-readable, for the API's 409 body: the verdict's code, or
    #: ``changed`` / ``not_cancellable`` / ``nothing_to_reconcile`` / ...
    code: str
    detail: str
    #: What the action made, when the caller shows it (an edit's new request).
    made: object = None
