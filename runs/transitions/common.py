"""What the transition modules share: the lease, the guards, the database
clock, the columns of an end and of a requeue, and appending a step under a
guarded UPDATE. Only the modules of ``runs.transitions`` import it."""

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import DatabaseError, connection
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Value
from django.db.models.functions import Now

from runs.models import AgentRun, RunStep
from runs.models.vocabulary import RunStatus

# One logger for every transition, whichever module it lives in.
logger = logging.getLogger("runs.transitions")


@dataclass(frozen=True)
class Lease:
    """Proof of ownership of a running run: every guarded write names it."""

    run_id: str
    owner: str
    token: int


def log_change(action: str, run_id, **fields) -> None:
    """Every state change is logged with the fields a JSON log line carries."""
    if not logger.isEnabledFor(logging.INFO):
        return  # one per step: skip building the line when nobody reads it
    logger.info(
        "%s run=%s %s",
        action,
        run_id,
        " ".join(f"{key}={value}" for key, value in fields.items()),
        extra={"action": action, "run_id": str(run_id), **fields},
    )


def owned_run(lease: Lease):
    """The run, as a queryset, while ``lease`` still holds it: every guarded
    write under a lease filters through this."""
    # The status is part of the guard: a run settled or cancelled by anyone
    # else is no longer this lease's to touch.
    return AgentRun.objects.filter(
        pk=lease.run_id,
        status=RunStatus.RUNNING,
        lease_owner=lease.owner,
        lease_token=lease.token,
    )


def owned_run_holding(lease: Lease, recorded: int | None):
    """``owned_run``, and — with ``recorded`` — holding that many of the
    attempt's own steps (``AgentRun.attempt_steps``)."""
    owned = owned_run(lease)
    return owned if recorded is None else owned.filter(attempt_steps=recorded)


def steps_lost(lease: Lease, recorded: int | None) -> bool:
    """After a guarded write matched nothing: whether the run is still this
    lease's but holds fewer of the attempt's steps than it recorded — a
    database server crash lost commits that had not reached disk (G12)."""
    return recorded is not None and owned_run(lease).filter(attempt_steps__lt=recorded).exists()


def update_returning(queryset, returning: tuple[str, ...], **changes) -> list[tuple]:
    """One guarded ``UPDATE … RETURNING``: the rows it matched, with ``returning``'s
    columns as they are after the update.

    Django's ``update()`` returns only a count; reading the row back costs a
    second statement (and a transaction around both). ``QuerySet._update``
    with ``returning_fields`` is the path ``Model.save()`` takes for
    database-returned fields; PostgreSQL and SQLite both support RETURNING.
    """
    meta = queryset.model._meta
    values = [(meta.get_field(name), None, value) for name, value in changes.items()]
    fields = [meta.get_field(name) for name in returning]
    return queryset._update(values, returning_fields=fields)


def db_time(after_seconds: float = 0):
    """The database's clock, ``after_seconds`` from now, as an SQL expression.

    Every lease and every staleness check uses the database's clock, so
    workers and reapers on machines whose clocks disagree still agree on
    which leases have expired.
    """
    if not after_seconds:
        return Now()
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=after_seconds), output_field=DurationField()),
        output_field=DateTimeField(),
    )


def append_step(run_id, lease_token: int | None, step: dict):
    """Insert a step numbered by the ``step_count`` the caller's guarded UPDATE
    just incremented (its row lock is held until commit, so the number is
    ours alone). ``lease_token`` None: the run's current one. Returns the
    step's sequence and the run's ``cancel_requested_at``."""
    return append_steps(run_id, lease_token, [step])


def append_steps(run_id, lease_token: int | None, steps: list[dict]):
    """``append_step`` for the ``len(steps)`` numbers the caller's UPDATE
    took, in order; returns the last one's sequence (None for no steps)."""
    last, cancel_at, current_token = (
        AgentRun.objects.filter(pk=run_id)
        .values_list("step_count", "cancel_requested_at", "lease_token")
        .get()
    )
    token = current_token if lease_token is None else lease_token
    first = last - len(steps) + 1
    RunStep.objects.bulk_create(
        RunStep(run_id=run_id, sequence=first + offset, lease_token=token, **step)
        for offset, step in enumerate(steps)
    )
    return (last if steps else None), cancel_at


def ending_changes(status: str, reason: str, **fields) -> dict:
    """The columns an UPDATE that ends a run sets: ``status`` for
    ``reason``, now, the lease let go; ``fields`` besides."""
    return {
        "status": status,
        "termination_reason": reason,
        "finished_at": db_time(),
        "lease_owner": "",
        "lease_expires_at": None,
        **fields,
    }


def requeue_changes(delay_seconds: float = 0) -> dict:
    """The columns an UPDATE that puts a run back in the queue sets: due in
    ``delay_seconds``, with a new dispatch number for its job (G4)."""
    # The fence is cleared: whoever requeues has decided that no
    # non-idempotent write is in doubt.
    return {
        "status": RunStatus.QUEUED,
        "lease_owner": "",
        "lease_expires_at": None,
        "pending_effect": "",
        "pending_call": None,
        "requeue_count": F("requeue_count") + 1,
        "dispatch_count": F("dispatch_count") + 1,
        "available_at": db_time(delay_seconds),
    }


def recover_connection(*, discard: bool = False) -> None:
    """After an attempt failed on a database error: the next statement (its
    settle) reconnects instead of failing on a dead socket. ``discard``:
    drop the connection whatever its state (a statement was interrupted)."""
    if discard and not connection.in_atomic_block:
        try:
            connection.close()
        except DatabaseError:
            pass  # closed all the same: the next statement reconnects
        return
    drop_broken_connection()


def drop_broken_connection() -> bool:
    """After a database error, drop the connection if it is dead so the next
    statement reconnects instead of failing on a closed socket forever.
    Returns whether it was dropped."""
    if connection.in_atomic_block:
        return False
    connection.close_if_unusable_or_obsolete()
    return connection.connection is None
