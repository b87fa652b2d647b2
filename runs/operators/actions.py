"""What operators do to runs — requeue, restart, cancel, reconcile, dismiss —
for the admin and the API alike.

Each action checks what it must (the requeue verdict, the run's state), goes
through a guarded transition, is recorded on the run's step stream (who,
when, what, why) and in the admin log (G11). None of them edits a step.
"""

from collections.abc import Callable
from dataclasses import dataclass

from django.contrib.admin.models import CHANGE, LogEntry
from django.db import transaction
from django.db.models.functions import Now

from runs import transitions
from runs.models import AgentRun, DeadLetter, WriteReconciliation
from runs.models.selectors import fenced_key
from runs.models.vocabulary import (
    ActionResult,
    ReconciliationOutcome,
    Resolution,
    RunStatus,
    StepKind,
)
from runs.operators.requeue_safety import requeue_safety, restart_safety
from runs.queue.dispatch import dispatch_or_fail
from runs.transitions import CancelOutcome


def _step(operator, action: str, note: str, **details) -> dict:
    return {
        "kind": StepKind.OPERATOR,
        "result": {"operator": operator.get_username(), "action": action, "note": note, **details},
    }


def _log(operator, queryset, message: str) -> None:
    LogEntry.objects.log_actions(
        operator.pk, queryset, CHANGE, change_message=message, single_object=True
    )


def _resolve_dead_letters(run_id, operator, resolution: str, note: str) -> None:
    DeadLetter.objects.filter(run_id=run_id, resolved_at__isnull=True).update(
        resolution=resolution, resolved_by=operator, resolved_at=Now(), resolution_note=note
    )


def requeue(run: AgentRun, operator, note: str = "") -> ActionResult:
    """Requeue ``run`` if ``requeue_safety`` allows it: the next attempt
    resumes from the journal (G12). It is dispatched after commit through the
    same path as a new run."""
    return _back_in_queue(run, operator, note, _REQUEUE, requeue_safety(run))


def restart(run: AgentRun, operator, note: str = "") -> ActionResult:
    """Restart ``run`` from the beginning if ``restart_safety`` allows it:
    nothing recorded so far is replayed."""
    return _back_in_queue(run, operator, note, _RESTART, restart_safety(run))


@dataclass(frozen=True)
class _BackInQueue:
    action: str
    done: str  # the result's code, and the word the messages use
    transition: Callable[..., bool]


_REQUEUE = _BackInQueue("requeue", "requeued", transitions.operator_requeue)
_RESTART = _BackInQueue("restart", "restarted", transitions.operator_restart)


def _back_in_queue(run: AgentRun, operator, note: str, how: _BackInQueue, verdict) -> ActionResult:
    if not verdict.allowed:
        return ActionResult(False, verdict.code, verdict.reason)
    with transaction.atomic():
        step = _step(operator, how.action, note, verdict=verdict.reason, previous=run.status)
        dispatch_count = how.transition(
            run.pk, seen_status=run.status, seen_step_count=run.step_count, step=step
        )
        if dispatch_count is None:
            return ActionResult(
                False, "changed", f"the run changed since it was checked ({how.done} already?)"
            )
        _resolve_dead_letters(run.pk, operator, Resolution.REQUEUED, note)
        _log(operator, AgentRun.objects.filter(pk=run.pk), f"{how.done.title()}. {note}".strip())
        transaction.on_commit(
            lambda: dispatch_or_fail(run.pk, dispatch_count=dispatch_count, team_id=run.team_id)
        )
    return ActionResult(True, how.done, f"{how.done}: {verdict.reason}")


def cancel(run: AgentRun, operator, note: str = "") -> ActionResult:
    """Cancel through the runtime's cancel: at once if queued, at the next step
    boundary if running. The cancel, its operator step and its log entry
    commit together or not at all (G11)."""
    with transaction.atomic():
        outcome = transitions.cancel(run.pk)
        if outcome in (CancelOutcome.TERMINAL, CancelOutcome.NOT_FOUND):
            return ActionResult(
                False, "not_cancellable", f"the run has already ended ({run.status})"
            )
        if outcome is CancelOutcome.ALREADY_REQUESTED:
            return ActionResult(False, "already_requested", "a cancel is already pending")
        transitions.append_operator_step(
            run.pk, _step(operator, "cancel", note, outcome=outcome.value)
        )
        _log(
            operator,
            AgentRun.objects.filter(pk=run.pk),
            f"Cancel ({outcome.value}). {note}".strip(),
        )
    detail = (
        "cancelled"
        if outcome is CancelOutcome.CANCELLED
        else "cancel requested: the worker stops at the next step boundary"
    )
    return ActionResult(True, outcome.value, detail)


def write_in_question(run: AgentRun) -> dict:
    """The write an operator reconciles: the fenced call, else the run's last
    write step (an idempotent write whose audit failed leaves its fence too)."""
    if run.pending_call:
        return {**run.pending_call, "effect": run.pending_effect}
    return {}


def reconcile(run: AgentRun, operator, outcome: str, note: str) -> ActionResult:
    """Record whether the write left in doubt landed. A note is mandatory."""
    if outcome not in ReconciliationOutcome.values:
        return ActionResult(
            False, "invalid", f"outcome must be one of {ReconciliationOutcome.values}"
        )
    if not note.strip():
        return ActionResult(False, "note_required", "say why: a note is required")
    if run.status not in RunStatus.terminal() or not run.pending_effect:
        return ActionResult(
            False, "nothing_to_reconcile", "the run has no write in doubt (or has not ended)"
        )
    call = write_in_question(run)
    with transaction.atomic():
        # Bound to the write the operator was shown: the run's fence as it
        # stood then, still standing (locked until commit, so it cannot be
        # requeued or stamped anew in between).
        still_in_question = (
            AgentRun.objects.select_for_update()
            .filter(
                pk=run.pk,
                status__in=RunStatus.terminal(),
                lease_token=run.lease_token,
                pending_effect=run.pending_effect,
            )
            # A fence stamped before calls were stamped with it has no key.
            .annotate(fenced_key=fenced_key())
            .filter(fenced_key=call.get("idempotency_key", ""))
            .exists()
        )
        if not still_in_question:
            return ActionResult(
                False, "changed", "the run changed since it was shown: look at its write again"
            )
        _, created = WriteReconciliation.objects.get_or_create(
            run=run,
            lease_token=run.lease_token,
            idempotency_key=call.get("idempotency_key", ""),
            defaults={
                "outcome": outcome,
                "note": note,
                "tool_name": call.get("tool", ""),
                "arguments": call.get("arguments"),
                "operator": operator,
            },
        )
        if not created:
            return ActionResult(False, "already_reconciled", "this write was reconciled already")
        transitions.append_operator_step(
            run.pk, _step(operator, "reconcile", note, outcome=outcome, write=call)
        )
        _resolve_dead_letters(run.pk, operator, Resolution.RECONCILED, note)
        _log(operator, AgentRun.objects.filter(pk=run.pk), f"Reconciled {outcome}. {note}")
    return ActionResult(True, "reconciled", f"the write was recorded as {outcome}")


def dismiss(dead_letter: DeadLetter, operator, note: str) -> ActionResult:
    """Close a dead letter without requeuing its run. A note is mandatory."""
    if not note.strip():
        return ActionResult(False, "note_required", "say why: a note is required")
    with transaction.atomic():
        dismissed = DeadLetter.objects.filter(pk=dead_letter.pk, resolved_at__isnull=True).update(
            resolution=Resolution.DISMISSED,
            resolved_by=operator,
            resolved_at=Now(),
            resolution_note=note,
        )
        if not dismissed:
            return ActionResult(False, "already_resolved", "this dead letter is resolved already")
        transitions.append_operator_step(
            dead_letter.run_id, _step(operator, "dismiss", note, dead_letter=dead_letter.pk)
        )
        _log(operator, DeadLetter.objects.filter(pk=dead_letter.pk), f"Dismissed. {note}")
    return ActionResult(True, "dismissed", "dismissed")
