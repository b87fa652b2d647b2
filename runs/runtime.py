"""The runtime: start runs, execute them under a lease, settle them.

``enqueue`` stores a queued run and dispatches its job after commit;
``run_queued`` is what a job does; ``run`` executes an interactive run inline.
The agent loop is driven here and observed by ``LeasedExecution``.
"""

import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time

import redis
from django.conf import settings
from django.db import DatabaseError, transaction

from runs import dispatch, transitions
from runs.errors import AuditPersistenceFailed, LeaseLost, RunCancelled, WriteOutcomeUnknown
from runs.execution import LeasedExecution, withdraw_unstarted_fence
from runs.failures import classify, is_retryable
from runs.journal import Journal, JournalUnreplayable, read_journal_of
from runs.loop import run_agent_loop
from runs.metrics import LEASES_LOST, REPLAYED_STEPS, RESUMES, STEPS, TimedProvider
from runs.models import AgentRun
from runs.providers import ProviderError, build_provider
from runs.retry import decide_retry
from runs.run_request import (
    InvalidRunRequest,
    RunRequest,
    parse_run_request,
    parse_stored_request,
)
from runs.transitions import Lease
from runs.vocabulary import RunMode, RunStatus, StepKind, TerminationReason
from tools.effects import ToolEffect
from tools.registry import get_registry

logger = logging.getLogger(__name__)


def worker_identity() -> str:
    """Names one execution: host, process and a nonce, so two executions in
    the same process never share a lease owner."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def enqueue(request_data) -> AgentRun:
    """Validate and store a ``queued`` run; its job is dispatched after commit.

    Raises ``InvalidRunRequest`` and stores nothing when the request is bad.
    """
    run_request = parse_run_request(request_data)
    # One INSERT, atomic on its own. Inside a caller's transaction the job
    # waits for the caller's commit; outside one, Django runs it at once.
    run = transitions.create_queued_run(run_request.as_json(), run_request.prompt)
    transaction.on_commit(lambda: dispatch_or_fail(run.pk, dispatch_count=run.dispatch_count))
    return run


def dispatch_or_fail(run_id, *, dispatch_count: int, delay_seconds: float = 0) -> None:
    """Dispatch the job of the run's ``dispatch_count``-th time in the queue.

    The run row is the state (G4): if Redis cannot take the job — away,
    read-only in a failover, out of memory, refusing our credentials — the
    run stays ``queued``, due as it is, and the reaper dispatches it again
    once Redis is back (G7). Only a failure that is not Redis's (a
    ``REDIS_URL`` that is not a Redis URL, say) fails the run, with a dead
    letter.
    """
    try:
        dispatch.dispatch(run_id, dispatch_count=dispatch_count, delay_seconds=delay_seconds)
    except Exception as error:
        failure_class = classify(error)
        if isinstance(error, redis.RedisError) or is_retryable(failure_class):
            logger.warning(
                "run=%s dispatch failed (%s: %s); left queued for the reaper to dispatch again",
                run_id,
                type(error).__name__,
                error,
            )
            return
        logger.exception("run=%s dispatch failed", run_id)
        try:
            transitions.fail_dispatch(run_id, dispatch_count, error, failure_class)
        except DatabaseError:
            logger.exception("run=%s could not be marked dispatch_failed", run_id)


def dispatch_many_or_fail(runs: list[tuple[str, int]]) -> None:
    """Dispatch many ``(run_id, dispatch_count)`` at once; if that fails,
    dispatch each on its own (``dispatch_or_fail``)."""
    try:
        dispatch.dispatch_many(runs)
    except Exception:
        logger.exception("dispatch of %d runs in one pipeline failed; one by one", len(runs))
        for run_id, dispatch_count in runs:
            dispatch_or_fail(run_id, dispatch_count=dispatch_count)


def run_queued(run_id) -> None:
    """Claim and execute a queued run. Never raises for a run's outcome.

    A duplicate or stale job finds the run not ``queued`` and does nothing.
    """
    claimed = transitions.claim(run_id, worker_identity(), settings.NRLLM_LEASE_SECONDS)
    if claimed is None:
        logger.info("run=%s not claimable (already taken or ended); job ignored", run_id)
        return
    if claimed.request_recorded:
        STEPS.labels(StepKind.REQUEST, "none").inc()
    _execute(
        claimed.lease,
        claimed.request,
        RunMode.QUEUED,
        requeue_count=claimed.requeue_count,
        resumed=claimed.resumed,
        disabled_tools=claimed.disabled_tools,
        recorded_steps=1 if claimed.request_recorded else 0,
    )


def run(request_data) -> AgentRun:
    """Execute an ``interactive`` run inline, under a lease, and return it ended."""
    run_request = parse_run_request(request_data)
    lease = transitions.begin_interactive(
        run_request.as_json(),
        run_request.prompt,
        worker_identity(),
        settings.NRLLM_LEASE_SECONDS,
    )
    try:
        # parse_run_request has just refused any disabled tool.
        _execute(
            lease,
            run_request.as_json(),
            RunMode.INTERACTIVE,
            requeue_count=0,
            resumed=False,
            disabled_tools=frozenset(),
        )
    except KeyboardInterrupt as interrupt:
        # The caller stopped it (Ctrl-C; run_agent turns SIGTERM into this):
        # nobody finishes the run after it, not even the reaper.
        with _signals_held():
            _settle_interrupted(lease)
        raise CallerInterrupted(lease.run_id) from interrupt
    return AgentRun.objects.get(pk=lease.run_id)


class CallerInterrupted(KeyboardInterrupt):
    """``run`` was interrupted; ``run_id`` says which run (settled
    ``cancelled``, unless it had ended already)."""

    def __init__(self, run_id: str):
        super().__init__(run_id)
        self.run_id = run_id


@contextlib.contextmanager
def _signals_held():
    """A second Ctrl-C or SIGTERM while the interrupted run settles must not
    cut the settle short (main thread only: signals reach no other)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signum: signal.signal(signum, signal.SIG_IGN) for signum in _STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _settle_interrupted(lease: Lease) -> None:
    """End an interactive run its caller interrupted ``cancelled``, the fence
    as it stands (a write the interrupt may have cut short stays in doubt).
    If the database cannot be reached, the reaper ends it ``abandoned``."""
    logger.warning("run=%s interrupted by its caller; settling cancelled", lease.run_id)
    for _ in range(2):
        # The interrupt may have cut a statement short: a connection in an
        # unknown state is dropped, and the settle runs on a new one.
        transitions.recover_connection(discard=True)
        try:
            transitions.settle(lease, RunStatus.CANCELLED, TerminationReason.CANCELLED)
            return
        except DatabaseError:
            logger.exception("run=%s interrupted run could not be settled", lease.run_id)


def _stored_request(stored: dict) -> RunRequest:
    # Stored requests were valid when enqueued; tools may since have been
    # removed or disabled, which the agent loop handles by not offering them.
    return RunRequest(
        prompt=stored["prompt"],
        tools=tuple(stored.get("tools", [])),
        provider=stored["provider"],
        max_iterations=stored["max_iterations"],
    )


def _offered_tools(names, disabled: frozenset[str]) -> dict:
    registry = get_registry()
    return {name: registry.get(name) for name in names if name in registry and name not in disabled}


def _resumption(lease: Lease, stored: dict, disabled: frozenset[str]) -> tuple[RunRequest, Journal]:
    """What a re-executed attempt continues from: its request, checked again,
    and its journal (G12). Raises ``JournalUnreplayable`` rather than improvise."""
    try:
        request = parse_stored_request(stored)
    except InvalidRunRequest as error:
        raise JournalUnreplayable(f"the stored request no longer parses: {error}") from None
    return request, read_journal_of(lease.run_id, request, disabled=disabled)


def _execute(
    lease: Lease,
    stored_request: dict,
    mode: str,
    *,
    requeue_count: int,
    resumed: bool,
    disabled_tools: frozenset[str],
    recorded_steps: int = 0,
) -> None:
    """Drive the loop under ``lease``. A queued run's claim recorded its
    request step (``recorded_steps``); an interactive run records it here. A
    re-executed run resumes: it replays its journal and goes live after it
    (G12)."""
    execution = LeasedExecution(
        lease,
        settings.NRLLM_LEASE_SECONDS,
        settings.NRLLM_OPERATION_MARGIN_SECONDS,
        recorded_steps=recorded_steps,
    )
    try:
        if resumed:
            request, journal = _resumption(lease, stored_request, disabled_tools)
        else:
            request, journal = _stored_request(stored_request), Journal()
        if mode == RunMode.INTERACTIVE:
            execution.record_request(stored_request)
        if journal:
            _note_resume(execution, journal)
        outcome = run_agent_loop(
            prompt=request.prompt,
            provider=TimedProvider(
                build_provider(request.provider, attempt=lease.token), request.provider["kind"]
            ),
            tools=_offered_tools(request.tools, disabled_tools),
            max_iterations=request.max_iterations,
            observer=execution,
            journal=journal.turns,
        )
    except LeaseLost:
        LEASES_LOST.inc()
        logger.warning("run=%s lease_token=%s lost; settling nothing", lease.run_id, lease.token)
        return
    except RunCancelled as cancel:
        _withdraw_unstarted(lease, cancel)
        transitions.settle(lease, RunStatus.CANCELLED, TerminationReason.CANCELLED)
        return
    except JournalUnreplayable as error:
        _dead_letter_unreplayable(lease, error)
        return
    except Exception as error:
        _settle_failure(lease, error, mode, requeue_count=requeue_count)
        return
    if execution.settled:
        return  # the final answer's record settled the run
    if outcome.reason == TerminationReason.COMPLETED:
        # A replayed final answer, or one whose record the database refused:
        # settled as ``finish`` settles, so a pending cancel still wins (G9).
        transitions.finish(lease, [], output=outcome.output)
    else:
        transitions.settle(lease, RunStatus.FAILED, outcome.reason)


def _note_resume(execution: LeasedExecution, journal: Journal) -> None:
    logger.info("run=%s %s", execution.lease.run_id, journal.describe())
    RESUMES.inc()
    REPLAYED_STEPS.labels(StepKind.LLM).inc(len(journal.turns))
    REPLAYED_STEPS.labels(StepKind.TOOL).inc(journal.tool_results)
    execution.after_step(journal.resume_event())


def _dead_letter_unreplayable(lease: Lease, error: JournalUnreplayable) -> None:
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


def _withdraw_unstarted(lease: Lease, error: Exception) -> None:
    """The tool the attempt stopped before did not start: a fence still
    standing for it would leave a write in doubt that never ran (G6)."""
    key = getattr(error, "unstarted_call", None)
    if key is not None:
        withdraw_unstarted_fence(lease, key)


def _interactive_reason(error: Exception) -> str:
    if isinstance(error, ProviderError):
        return TerminationReason.PROVIDER_FAILED
    if isinstance(error, WriteOutcomeUnknown) and error.effect == ToolEffect.NON_IDEMPOTENT_WRITE:
        return TerminationReason.WRITE_INTERRUPTED
    return TerminationReason.NOT_RETRYABLE


#: How long an attempt whose write audit failed keeps trying to say so on
#: the fence while the database is away: well inside the lease it holds,
#: which covered the write's time limit plus the operation margin, so the
#: reaper cannot act on the run meanwhile.
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


def _settle_failure(lease: Lease, error: Exception, mode: str, *, requeue_count: int) -> None:
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
    _withdraw_unstarted(lease, error)
    if isinstance(error, AuditPersistenceFailed) and error.call is not None:
        _mark_audit_failed(lease, error.call)
    try:
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
