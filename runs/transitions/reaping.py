"""The reaper's transitions (G7): each re-checks staleness in its UPDATE."""

from dataclasses import dataclass

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now

from runs.models import AgentRun, DeadLetter
from runs.transitions._common import (
    _append_step,
    _back_in_queue,
    _ended,
    _log_change,
    db_time,
)
from runs.vocabulary import RunStatus, TerminationReason


@dataclass(frozen=True)
class StaleLease:
    """What the reaper saw of a run whose lease had expired."""

    run_id: str
    token: int


def _still_stale(stale: StaleLease, as_of):
    # Re-checked inside every reaper UPDATE: a worker that renewed after the
    # reaper looked (a slow-but-alive worker) no longer matches, and keeps its run.
    return AgentRun.objects.filter(
        pk=stale.run_id,
        status=RunStatus.RUNNING,
        lease_token=stale.token,
        lease_expires_at__lt=as_of if as_of is not None else Now(),
    )


def _reap(stale: StaleLease, as_of, changes: dict, step: dict, dead_letter_fields=None) -> bool:
    with transaction.atomic():
        matched = _still_stale(stale, as_of).update(step_count=F("step_count") + 1, **changes)
        if not matched:
            return False
        _append_step(stale.run_id, stale.token, step)
        if dead_letter_fields is not None:
            DeadLetter.objects.create(run_id=stale.run_id, **dead_letter_fields)
    _log_change("reap", stale.run_id, lease_token=stale.token, decision=step["result"]["decision"])
    return True


def reap_requeue(stale: StaleLease, as_of, step: dict) -> bool:
    """``running → queued`` for a stale run that is safe to run again."""
    return _reap(stale, as_of, _back_in_queue(), step)


def reap_dead_letter(stale: StaleLease, as_of, step: dict, *, reason: str, error: str) -> bool:
    """``running → failed`` with a dead letter; the fence is left standing."""
    details = {"failure_class": "", "error_type": "LeaseExpired", "error_message": error}
    return _reap(
        stale,
        as_of,
        _ended(RunStatus.FAILED, reason, **details),
        step,
        dead_letter_fields={"reason": reason, **details},
    )


def reap_cancelled(stale: StaleLease, as_of, step: dict) -> bool:
    """A stale run an operator asked to cancel ends ``cancelled``."""
    return _reap(stale, as_of, _ended(RunStatus.CANCELLED, TerminationReason.CANCELLED), step)


def note_redispatch(run_id, step: dict) -> bool:
    """Record on a still-``queued`` run that its lost job was dispatched again."""
    with transaction.atomic():
        matched = AgentRun.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
            step_count=F("step_count") + 1, available_at=db_time()
        )
        if matched:
            token = AgentRun.objects.filter(pk=run_id).values_list("lease_token", flat=True).get()
            _append_step(run_id, token, step)
    return bool(matched)
