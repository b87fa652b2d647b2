"""How an attempt that failed ends (G3, G8, G12, G13): retried, dead-lettered
or failed, as its error, its fence and its budget say. A settle that
itself fails leaves the run to the reaper (G7)."""

import logging
import time

from django.conf import settings
from django.db import DatabaseError

from runs import transitions
from runs.models import AgentRun
from runs.models.vocabulary import RunMode, RunStatus, TerminationReason
from runs.providers import ProviderError
from runs.providers.failures import classify, is_retryable
from runs.queue.dispatch import dispatch_or_fail
from runs.runtime.errors import (
    AuditPersistenceFailed,
    BudgetExhausted,
    WriteNotDurable,
    WriteOutcomeUnknown,
)
from runs.runtime.journal import JournalUnreplayable
from runs.runtime.retry import decide_retry
from runs.runtime.step_ledger import withdraw_unstarted_fence
from runs.transitions import Lease
from tools.effects import ToolEffect

logger = logging.getLogger(__name__)


def dead_letter_unreplayable(lease: Lease, error: JournalUnreplayable) -> None:
    logger.error("run=%s journal cannot be replayed: %s", lease.run_id, error)
    try:
        transitions.dead_letter(
            lease,
            TerminationReason.JOURNAL_UNREPLAYABLE,
            failure_class="",
            error_type="JournalUnreplayable",
            error_message=str(error),
            # A write whose outcome is not recorded may have run: it stands
            # as the write in question, as an interrupted one does.
            fence=error.write,
        )
    except DatabaseError:
        # Left running without a fence; the reaper requeues it and the next
        # attempt meets the same journal.
        logger.exception("run=%s could not be dead-lettered", lease.run_id)


def withdraw_unstarted(lease: Lease, error: Exception) -> None:
    """The tool the attempt stopped before did not start: a fence still
    standing for it would leave a write in doubt that never ran (G6)."""
    key = getattr(error, "unstarted_call", None)
    if key is not None:
        withdraw_unstarted_fence(lease, key)


def _interactive_reason(error: Exception) -> str:
    if isinstance(error, WriteNotDurable):
        return TerminationReason.WRITE_INTERRUPTED
    if isinstance(error, ProviderError):
        return TerminationReason.PROVIDER_FAILED
    if isinstance(error, WriteOutcomeUnknown) and error.effect == ToolEffect.NON_IDEMPOTENT_WRITE:
        return TerminationReason.WRITE_INTERRUPTED
    return TerminationReason.NOT_RETRYABLE


#: How long an attempt whose write audit failed keeps trying to say so on
#: the fence while the database is away: well inside the lease it holds (a
#: lease from the write's end, kept by the heartbeat while the database
#: lets it, G16), so the reaper does not act on the run meanwhile.
AUDIT_MARK_ATTEMPTS = (0.2, 0.5, 1, 2, 4)


def _mark_audit_failed(lease: Lease, call: dict) -> None:
    """Make the failed audit durable on the fence before anything else, so
    the run is never retried automatically whatever happens to its settle
    (G3). While the database is away it tries again for a few seconds."""
    budget = settings.NRLLM_OPERATION_MARGIN_SECONDS / 2
    for pause in (*AUDIT_MARK_ATTEMPTS, None):
        try:
            transitions.mark_audit_failed(lease, call)
            return
        except DatabaseError as error:
            transitions.recover_connection()
            if pause is None or pause > budget or not is_retryable(classify(error)):
                logger.error("run=%s failed audit could not be marked: %s", lease.run_id, error)
                return
            budget -= pause
            time.sleep(pause)


def settle_failure(lease: Lease, error: Exception, mode: str, *, requeue_count: int) -> None:
    if isinstance(error, BudgetExhausted):
        logger.warning("run=%s lease_token=%s %s", lease.run_id, lease.token, error)
        try:
            _end_budget_exhausted(lease, error, mode)
        except DatabaseError:
            # Left running; its lease lapses and the reaper requeues it, and
            # the next attempt's check stops it again before any call.
            logger.exception("run=%s could not be settled budget_exhausted", lease.run_id)
        return
    failure_class = classify(error)
    details = {
        "failure_class": failure_class,
        "error_type": type(error).__name__,
        "error_message": str(error),
    }
    logger.warning(
        "run=%s lease_token=%s failed: %s (%s)", lease.run_id, lease.token, error, failure_class
    )
    if isinstance(error, DatabaseError):
        transitions.recover_connection()
    withdraw_unstarted(lease, error)
    if isinstance(error, AuditPersistenceFailed) and error.call is not None:
        _mark_audit_failed(lease, error.call)
    try:
        if isinstance(error, WriteNotDurable):
            # The database may not show the write any more: the attempt's
            # own knowledge of it stands as the run's write in question.
            _end_write_in_doubt(lease, error, mode, details)
            return
        if mode == RunMode.INTERACTIVE:
            transitions.settle(lease, RunStatus.FAILED, _interactive_reason(error), **details)
            return
        pending_effect = (
            AgentRun.objects.filter(pk=lease.run_id).values_list("pending_effect", flat=True).get()
        )
        decision = decide_retry(
            failure_class=failure_class,
            pending_effect=pending_effect,
            requeue_count=requeue_count,
            max_requeues=settings.NRLLM_MAX_REQUEUES,
            retry_after=getattr(error, "retry_after", None),
            backoff_base=settings.NRLLM_RETRY_BACKOFF_SECONDS,
            backoff_cap=settings.NRLLM_RETRY_BACKOFF_MAX_SECONDS,
        )
        if decision.requeue:
            delay = decision.delay_seconds
            dispatch_count = transitions.requeue_for_retry(lease, **details, delay_seconds=delay)
            if dispatch_count is not None:
                dispatch_or_fail(lease.run_id, dispatch_count=dispatch_count, delay_seconds=delay)
            return
        transitions.dead_letter(lease, decision.dead_letter_reason, **details)
    except DatabaseError:
        # The settle itself failed: the run stays running with its fence as it
        # stands, and its lease expires; recovery is the reaper's (G7).
        logger.exception("run=%s could not be settled after failure", lease.run_id)


def _end_budget_exhausted(lease: Lease, error: BudgetExhausted, mode: str) -> None:
    """Stopped before a model call (G17): nothing is in flight, no fence
    stands for a call of this attempt. Not retryable (a retry would meet the
    same spend): a queued run is dead-lettered ``budget_exhausted``."""
    reason = TerminationReason.BUDGET_EXHAUSTED
    details = {"failure_class": "", "error_type": "BudgetExhausted", "error_message": str(error)}
    if mode == RunMode.INTERACTIVE:
        transitions.settle(lease, RunStatus.FAILED, reason, **details)
    else:
        transitions.dead_letter(lease, reason, **details)


def _end_write_in_doubt(lease: Lease, error: WriteNotDurable, mode: str, details: dict) -> None:
    """A write ran whose record is not durable: never retried, whatever its
    effect. Dead-lettered ``write_interrupted`` (an interactive run ends
    ``failed`` with that reason) with the call standing on its fence."""
    reason = TerminationReason.WRITE_INTERRUPTED
    if mode == RunMode.INTERACTIVE:
        transitions.settle(lease, RunStatus.FAILED, reason, fence=error.write, **details)
    else:
        transitions.dead_letter(lease, reason, fence=error.write, **details)
