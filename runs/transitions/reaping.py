"""The reaper's transitions (G7): each re-checks staleness in its UPDATE, run by
run, and takes a whole group of runs with the same decision at once."""

import functools
import operator
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Case, F, Q, TextField, Value, When
from django.db.models.functions import Now

from runs.models import AgentRun, DeadLetter, RunStep
from runs.transitions._common import (
    _append_step,
    _back_in_queue,
    _ended,
    _log_change,
    _update_returning,
    db_time,
)
from runs.vocabulary import RunStatus, TerminationReason


@dataclass(frozen=True)
class StaleLease:
    """What the reaper saw of a run whose lease had expired."""

    run_id: str
    token: int


@dataclass(frozen=True)
class Reaping:
    """A stale run, the reaper step that explains the decision, and for a
    dead letter the error it records."""

    stale: StaleLease
    step: dict
    error: str = ""


def _still_stale(reapings: list[Reaping], as_of):
    # Re-checked inside every reaper UPDATE, run by run (its own token): a
    # worker that renewed after the reaper looked (a slow-but-alive worker)
    # no longer matches, and keeps its run.
    seen = functools.reduce(
        operator.or_, (Q(pk=r.stale.run_id, lease_token=r.stale.token) for r in reapings)
    )
    return AgentRun.objects.filter(
        seen,
        status=RunStatus.RUNNING,
        lease_expires_at__lt=as_of if as_of is not None else Now(),
    )


def _reap(reapings: list[Reaping], as_of, changes: dict, dead_letter: dict | None = None):
    """One UPDATE for the whole group, then its steps (and dead letters) in one
    INSERT each, in one transaction. Returns the ids of the runs it changed."""
    if not reapings:
        return []
    by_run = {r.stale.run_id: r for r in reapings}
    with transaction.atomic():
        rows = _update_returning(
            _still_stale(reapings, as_of),
            ("id", "step_count"),
            step_count=F("step_count") + 1,
            **changes,
        )
        reaped = [(str(run_id), sequence) for run_id, sequence in rows]
        RunStep.objects.bulk_create(
            RunStep(
                run_id=run_id,
                sequence=sequence,
                lease_token=by_run[run_id].stale.token,
                **by_run[run_id].step,
            )
            for run_id, sequence in reaped
        )
        if dead_letter is not None:
            DeadLetter.objects.bulk_create(
                DeadLetter(run_id=run_id, error_message=by_run[run_id].error, **dead_letter)
                for run_id, _ in reaped
            )
    for run_id, sequence in reaped:
        reaping = by_run[run_id]
        decision = reaping.step["result"]["decision"]
        _log_change(
            "reap", run_id, lease_token=reaping.stale.token, sequence=sequence, decision=decision
        )
    return [run_id for run_id, _ in reaped]


def reap_requeue(reapings: list[Reaping], as_of) -> list[str]:
    """``running → queued`` for stale runs that are safe to run again; returns
    the ids it requeued (the others were renewed or taken meanwhile)."""
    return _reap(reapings, as_of, _back_in_queue())


def reap_dead_letter(reapings: list[Reaping], as_of, *, reason: str) -> list[str]:
    """``running → failed`` with a dead letter each; the fence is left standing."""
    details = {"failure_class": "", "error_type": "LeaseExpired"}
    # Each run keeps its own error; one CASE sets them all in the same UPDATE.
    errors = Case(
        *(When(pk=r.stale.run_id, then=Value(r.error)) for r in reapings),
        default=Value(""),
        output_field=TextField(),
    )
    return _reap(
        reapings,
        as_of,
        _ended(RunStatus.FAILED, reason, error_message=errors, **details),
        dead_letter={"reason": reason, **details},
    )


def reap_cancelled(reapings: list[Reaping], as_of) -> list[str]:
    """Stale runs an operator asked to cancel end ``cancelled``."""
    return _reap(reapings, as_of, _ended(RunStatus.CANCELLED, TerminationReason.CANCELLED))


def note_redispatch(run_id, step: dict) -> bool:
    """Record on a still-``queued`` run that its lost job was dispatched again."""
    with transaction.atomic():
        matched = AgentRun.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
            step_count=F("step_count") + 1, available_at=db_time()
        )
        if matched:
            token = AgentRun.objects.filter(pk=run_id).values_list("lease_token", flat=True).get()
            sequence, _ = _append_step(run_id, token, step)
            _log_change("redispatch", run_id, lease_token=token, sequence=sequence)
    return bool(matched)
