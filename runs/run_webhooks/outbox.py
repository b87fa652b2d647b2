"""The run-ended webhook's outbox rows (``runs.models.run_events.RunEvent``): which
are due, and the guarded UPDATEs of a delivery — claim, delivered, failed
(given up after the last attempt).

A claim takes the next attempt (``attempts`` one higher) and pushes
``next_attempt_at`` past that attempt's backoff before anything is sent,
guarded on the attempts the deliverer saw and on the event still being
due and undelivered: of two deliverers (a worker and a reaper, two
reapers) one wins, and the other sends nothing. A deliverer that dies
after its claim leaves the event due again after the backoff, never lost.
Time is the database's, or a test's ``as_of``.
"""

import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import DateTimeField, Value

from runs.models.run_events import RunEvent
from runs.transitions import db_time


def due_events(
    *, limit: int, as_of: datetime | None = None, run_id=None, untried_only: bool = False
) -> list[tuple[uuid.UUID, int]]:
    """Up to ``limit`` events due now (or ``as_of``), longest due first: their
    ids and the attempts made so far. ``run_id``: that run's only;
    ``untried_only``: those never tried."""
    due = RunEvent.objects.filter(
        delivered_at__isnull=True, gave_up_at__isnull=True, next_attempt_at__lte=_now(as_of)
    )
    if run_id is not None:
        due = due.filter(run_id=run_id)
    if untried_only:
        due = due.filter(attempts=0)
    return list(due.order_by("next_attempt_at").values_list("id", "attempts")[:limit])


def backoff_seconds(attempt: int) -> float:
    """How long after ``attempt`` (1 for the first) the next one is due:
    ``NRLLM_RUN_WEBHOOK_BACKOFF_SECONDS`` doubling up to the maximum."""
    first = settings.NRLLM_RUN_WEBHOOK_BACKOFF_SECONDS
    return min(first * 2 ** min(attempt - 1, 32), settings.NRLLM_RUN_WEBHOOK_BACKOFF_MAX_SECONDS)


def claim(event_id, seen_attempts: int, *, as_of: datetime | None = None) -> RunEvent | None:
    """Take attempt ``seen_attempts + 1`` of the event, or None: another
    deliverer took it, or it was delivered or given up, since it was seen.
    The event is held (not due) for the attempt's backoff, and at least
    twice the POST's timeout: no other deliverer sends it meanwhile."""
    attempt = seen_attempts + 1
    hold = max(backoff_seconds(attempt), 2 * settings.NRLLM_RUN_WEBHOOK_TIMEOUT_SECONDS)
    claimed = RunEvent.objects.filter(
        pk=event_id,
        attempts=seen_attempts,
        delivered_at__isnull=True,
        gave_up_at__isnull=True,
        next_attempt_at__lte=_now(as_of),
    ).update(
        attempts=attempt,
        last_attempt_at=_now(as_of),
        next_attempt_at=_now(as_of, after_seconds=hold),
    )
    if not claimed:
        return None  # another deliverer won, or it is no longer due
    # None if retention deleted the run (and its events) since the claim.
    return (
        RunEvent.objects.select_related("run__agent_version__agent", "run__team")
        .filter(pk=event_id)
        .first()
    )


def delivered(event: RunEvent, status: int, *, as_of: datetime | None = None) -> bool:
    """Record a 2xx answer. Guarded only on the event not being delivered
    yet: the receiver has it, whichever attempt this was."""
    return bool(
        RunEvent.objects.filter(pk=event.pk, delivered_at__isnull=True).update(
            delivered_at=_now(as_of), last_status=status, last_error=""
        )
    )


def failed(
    event: RunEvent, status: int | None, error: str, *, as_of: datetime | None = None
) -> bool:
    """Record a failed attempt (``status``: the answer's, None when none
    came); after the last attempt the event is given up. Whether it was
    given up. Guarded on this attempt: a later attempt's record wins."""
    give_up = event.attempts >= settings.NRLLM_RUN_WEBHOOK_MAX_ATTEMPTS
    changes = {"last_status": status, "last_error": error}
    if give_up:
        changes["gave_up_at"] = _now(as_of)
    recorded = RunEvent.objects.filter(
        pk=event.pk, attempts=event.attempts, delivered_at__isnull=True
    ).update(**changes)
    return bool(recorded) and give_up


def deliveries_of(run_id) -> list[RunEvent]:
    """A run's events with their deliveries, oldest first (the run page, the API)."""
    return list(RunEvent.objects.filter(run_id=run_id).order_by("occurred_at", "attempts"))


def _now(as_of: datetime | None, *, after_seconds: float = 0):
    if as_of is None:
        return db_time(after_seconds)
    return Value(as_of + timedelta(seconds=after_seconds), output_field=DateTimeField())
