"""Holding a run's lease: claim, renew (and fence), heartbeat, hand back."""

from dataclasses import dataclass, field

from django.db import DatabaseError, connection, transaction
from django.db.models import DurationField, ExpressionWrapper, F, Q
from django.db.models.functions import Now

from ground.commits import reaching_disk
from runs.models import AgentRun, HeldRun, RunStep
from runs.models.vocabulary import RunStatus, StepKind
from runs.transitions.common import (
    Lease,
    db_time,
    drop_broken_connection,
    log_change,
    logger,
    owned_run,
    owned_run_holding,
    update_returning,
)
from runs.transitions.step_journal import claim_in_one_statement
from spend.starting import StartingSpend, starting_spend_of
from tools.enabled import approval_overrides, disabled_tool_names


@dataclass(frozen=True)
class ClaimedRun:
    """What a worker needs from the run it just claimed, read by the claim itself."""

    lease: Lease
    request: dict
    requeue_count: int
    #: Steps exist from an earlier attempt: this attempt re-executes the run
    #: and must look for recorded writes before repeating one.
    resumed: bool
    #: The claim recorded the attempt's request step (fail-soft: it may not).
    request_recorded: bool
    #: Tools the request names that an operator has disabled since: not offered.
    disabled_tools: frozenset[str] = frozenset()
    #: The approval settings of the request's tools that are not ``default``.
    approval_overrides: dict = field(default_factory=dict)
    #: The run's totals, its model's price, its submitter's budget and
    #: spend (G17); None only where a caller built the claim by hand.
    spend: StartingSpend | None = None
    #: Its team has a cap on runs in flight: the attempt's end wakes a run
    #: the cap held back (G22).
    team_capped: bool = False


def claim(run_id, owner: str, lease_seconds: float) -> ClaimedRun | None:
    """Take a ``queued`` run: ``queued → running`` with a new lease token, and
    record the attempt's first step (its request) in the same transaction.

    Of any number of concurrent claims exactly one matches; a duplicate or
    stale job gets None and must do nothing, and so does a job that comes
    before the run is due (a retry's backoff, by the database's clock: the
    job a retry was scheduled with comes then, or the reaper dispatches the
    run again once it is overdue, G7). The UPDATE returns what the
    worker needs (token, request, budget, history), so one commit starts the
    attempt. The request step is fail-soft like every non-tool step (G2): if
    the database refuses it, the claim stands without it.
    """
    claimed = _UNTRIED
    if connection.vendor == "postgresql":
        claimed = _claim_with_request_step(run_id, owner, lease_seconds)
    if claimed is _UNTRIED:
        claimed = _claim_through_the_orm(run_id, owner, lease_seconds)
    if claimed is None:
        return None
    token, request, requeue_count, step_count, recorded, disabled, overrides, spend, capped = (
        claimed
    )
    sequence = step_count if recorded else None
    log_change("claim", run_id, lease_token=token, sequence=sequence)
    # Steps beyond the request step this claim numbered: an earlier attempt ran.
    resumed = step_count > 1
    lease = Lease(str(run_id), owner, token)
    return ClaimedRun(
        lease, request, requeue_count, resumed, recorded, disabled, overrides, spend, capped
    )


#: The one-statement claim failed: the ORM's claim is still to be tried.
_UNTRIED = object()


def _claim_with_request_step(run_id, owner: str, lease_seconds: float):
    """PostgreSQL's one-statement claim: (token, request, requeue_count,
    step_count, True, disabled tools, approval overrides, starting spend,
    team capped), None if not claimable, or ``_UNTRIED`` if the statement failed."""
    try:
        claimed = claim_in_one_statement(run_id, owner, lease_seconds)
    except DatabaseError as error:
        if drop_broken_connection():
            # The kept connection was dead (the server restarted, say). Jobs
            # skip Django's health check because this claim is it (runs/jobs.py).
            logger.warning("run=%s connection lost at the claim (%s); reconnecting", run_id, error)
        else:
            # Most likely the request step was refused: claim without it.
            logger.error("run=%s claim with its request step failed: %s", run_id, error)
        return _UNTRIED
    if claimed is None:
        return None
    token, request, requeue_count, step_count, disabled, overrides, spend, capped = claimed
    return token, request, requeue_count, step_count, True, disabled, overrides, spend, capped


def _claim_through_the_orm(run_id, owner: str, lease_seconds: float):
    """The same claim in ``UPDATE … RETURNING`` and a savepoint for the step:
    (token, request, requeue_count, step_count, recorded, disabled tools,
    approval overrides, starting spend, team capped) or None if not claimable."""
    with transaction.atomic():
        rows = update_returning(
            AgentRun.objects.filter(
                Q(available_at__isnull=True) | Q(available_at__lte=db_time()),
                pk=run_id,
                status=RunStatus.QUEUED,
            ),
            ("lease_token", "request", "requeue_count", "step_count"),
            status=RunStatus.RUNNING,
            lease_owner=owner,
            lease_token=F("lease_token") + 1,
            lease_expires_at=db_time(lease_seconds),
            pending_effect="",
            pending_call=None,
            started_at=db_time(),
            step_count=F("step_count") + 1,
            attempt_steps=1,
        )
        if not rows:
            return None
        token, request, requeue_count, step_count = rows[0]
        recorded = _record_request_step(run_id, step_count, token, request)
    requested = set(request.get("tools", []))
    disabled = frozenset(disabled_tool_names() & requested) if requested else frozenset()
    overrides = approval_overrides(requested) if requested else {}
    run = AgentRun.objects.select_related("team").get(pk=run_id)
    spend, capped = starting_spend_of(run), run.team.max_running is not None
    return token, request, requeue_count, step_count, recorded, disabled, overrides, spend, capped


def _record_request_step(run_id, sequence: int, token: int, request: dict) -> bool:
    """Insert the attempt's request step in a savepoint of the claim's
    transaction; on a refusal, undo the number it took and carry on."""
    try:
        with transaction.atomic():
            RunStep.objects.create(
                run_id=run_id,
                sequence=sequence,
                lease_token=token,
                kind=StepKind.REQUEST,
                arguments=request,
            )
    except DatabaseError as error:
        logger.error("run=%s request step not persisted: %s", run_id, error)
        AgentRun.objects.filter(pk=run_id).update(step_count=F("step_count") - 1, attempt_steps=0)
        return False
    return True


def seconds_until_due(run_id) -> float | None:
    """How long until the ``queued`` run ``run_id`` is due, by the database's
    clock (0 once it is: a claim that just missed it may try again); None
    when it is not queued, or its team's cap holds it back."""
    rows = (
        AgentRun.objects.filter(pk=run_id, status=RunStatus.QUEUED)
        # Held back by its team's cap: not due until it is woken (G22).
        .exclude(pk__in=HeldRun.objects.filter(run=run_id).values("run"))
        .annotate(early=ExpressionWrapper(F("available_at") - Now(), DurationField()))
        .values_list("early", flat=True)
    )
    if not rows:
        return None
    early = rows[0]
    return 0.0 if early is None else max(early.total_seconds(), 0.0)


@reaching_disk()
def renew_lease(
    lease: Lease,
    lease_seconds: float,
    *,
    fence: str = "",
    call: dict | None = None,
    recorded: int | None = None,
) -> bool:
    """Extend the lease (heartbeat); with ``fence``, also stamp the write fence.

    Before a tool call (``fence`` given, possibly empty) the renewal also
    requires that no cancel was requested, so a cancelled run starts no tool.
    False means the lease is lost or the run must stop — or, with
    ``recorded`` (as ``record_steps``'), that the run holds fewer of the
    attempt's steps than it recorded (``steps_lost`` tells): a fence is never
    stamped over steps a server crash lost, the turn that asked for the
    write among them (G12).
    """
    return bool(
        owned_run_holding(lease, recorded)
        .filter(cancel_requested_at__isnull=True)
        .update(
            lease_expires_at=db_time(lease_seconds),
            pending_effect=fence,
            pending_call=call if fence else None,
        )
    )


def withdraw_fence(lease: Lease, key: str) -> bool:
    """Clear the fence if it was stamped for the call whose idempotency key
    is ``key``: the caller knows that call did not start (G6)."""
    # Called after a failure, which may have broken the connection: dropped
    # before the transaction begins, which it could not do inside one.
    drop_broken_connection()
    with reaching_disk():
        return bool(
            owned_run(lease)
            .filter(pending_call__idempotency_key=key)
            .update(pending_effect="", pending_call=None)
        )


@reaching_disk()
def mark_audit_failed(lease: Lease, call: dict) -> bool:
    """Say on the fence standing for ``call`` (tool, arguments, idempotency
    key, as stamped) that the call executed and its step could not be
    recorded (G3): whatever happens to the settle after this, the reaper
    dead-letters the run ``not_retryable`` rather than requeue an
    ``idempotent_write`` fence. A fence stamped anew, or cleared, drops the
    mark with the call it belonged to."""
    return bool(
        owned_run(lease)
        .filter(pending_call__idempotency_key=call["idempotency_key"])
        .update(pending_call={**call, AUDIT_FAILED: True})
    )


#: The key of ``pending_call`` that says the call's audit failed.
AUDIT_FAILED = "audit_failed"


def heartbeat(lease: Lease, lease_seconds: float) -> bool:
    """Extend the lease at a step boundary; False if the lease is lost."""
    return bool(owned_run(lease).update(lease_expires_at=db_time(lease_seconds)))


def hand_back(lease: Lease) -> bool:
    """A worker that stops before the attempt ended (a drain past its grace,
    G15) lets its lease lapse now, settling nothing: the reaper decides the
    run on its next pass as it decides a dead worker's. False if the run is
    no longer this lease's."""
    return bool(owned_run(lease).update(lease_expires_at=db_time(0)))


def standing(lease: Lease) -> tuple[bool, bool]:
    """(whether the run is still this lease's, whether a cancel is pending):
    what a record in doubt that landed was committed under."""
    row = owned_run(lease).values_list("cancel_requested_at").first()
    return row is not None, row is not None and row[0] is not None


def cancel_requested(lease: Lease) -> bool:
    """Whether the run is still this lease's and an operator asked to cancel."""
    return owned_run(lease).filter(cancel_requested_at__isnull=False).exists()
