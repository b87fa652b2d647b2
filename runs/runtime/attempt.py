"""Executing one attempt of a run under its lease.

``run_queued`` is what a job does (claim, then execute); ``execute_attempt``
drives the agent loop, observed by ``LeasedExecution``, and ends the
attempt: settled, parked for approval, or handed to ``failed_attempts``.
Runs are started in ``starting``.
"""

import dataclasses
import logging
import os
import secrets
import socket
import time
from decimal import Decimal

from django.conf import settings

from runs import transitions
from runs.approvals import notices as approval_notices
from runs.approvals.gate import ApprovalGate, Decisions
from runs.models.metrics import LEASES_LOST, REPLAYED_STEPS, RESUMES, STEPS, TimedProvider
from runs.models.vocabulary import RunMode, RunStatus, StepKind, TerminationReason
from runs.providers import build_provider
from runs.providers.base import Turn
from runs.queue.held_runs import wake_held_runs
from runs.run_webhooks import deliver_new_events_of
from runs.runtime import heartbeat, rate_limit, spans
from runs.runtime.budget_watch import BudgetWatch
from runs.runtime.errors import AwaitingApproval, AwaitingInput, LeaseLost, RunCancelled
from runs.runtime.execution import LeasedExecution
from runs.runtime.failed_attempts import (
    dead_letter_unreplayable,
    settle_failure,
    withdraw_unstarted,
)
from runs.runtime.journal import Journal, JournalUnreplayable, read_journal_of
from runs.runtime.loop import run_agent_loop
from runs.runtime.reserving import CallReservations
from runs.runtime.run_request import InvalidRunRequest, RunRequest, parse_stored_request
from runs.transitions import Lease
from spend.starting import StartingSpend
from tools.approval_policy import tools_needing_approval
from tools.registry import offered_tools, require_available

logger = logging.getLogger(__name__)


def worker_identity() -> str:
    """Names one execution: host, process and a nonce, so two executions in
    the same process never share a lease owner."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


#: A job that comes at most this long before its run is due waits for it;
#: one that comes sooner (a duplicate or stale job while a retry's backoff
#: runs, G8) does nothing, and the run's own job, or the reaper, comes later.
EARLY_JOB_WAIT_SECONDS = 5


def run_queued(run_id) -> None:
    """Claim and execute a queued run. Never raises for a run's outcome.

    A duplicate or stale job finds the run not ``queued`` and does nothing.
    """
    claimed = claim_queued(run_id)
    if claimed is not None:
        execute_claimed(claimed)


def claim_queued(run_id) -> transitions.ClaimedRun | None:
    """Claim a queued run for this process, or None (and log why) if it is
    not claimable: taken, ended, or not yet due. A run's own job a little
    early waits for it (``EARLY_JOB_WAIT_SECONDS``)."""
    claimed = transitions.claim(run_id, worker_identity(), settings.NRLLM_LEASE_SECONDS)
    if claimed is None:
        early = transitions.seconds_until_due(run_id)
        if early is not None and early <= EARLY_JOB_WAIT_SECONDS:
            # Its own job a little early (RQ's scheduler keeps whole
            # seconds; its host's clock is not the database's): it waits.
            time.sleep(early)
            claimed = transitions.claim(run_id, worker_identity(), settings.NRLLM_LEASE_SECONDS)
    if claimed is None:
        logger.info(
            "run=%s not claimable (taken, ended, not yet due or held by its team's cap); "
            "job ignored",
            run_id,
        )
    return claimed


def execute_claimed(claimed: transitions.ClaimedRun) -> None:
    """Execute the attempt a claim began. Never raises for a run's outcome."""
    if claimed.request_recorded:
        STEPS.labels(StepKind.REQUEST, "none").inc()
    execute_attempt(
        claimed.lease,
        claimed.request,
        RunMode.QUEUED,
        requeue_count=claimed.requeue_count,
        resumed=claimed.resumed,
        disabled_tools=claimed.disabled_tools,
        approval_overrides=claimed.approval_overrides,
        recorded_steps=1 if claimed.request_recorded else 0,
        starting_spend=claimed.spend,
    )
    # The attempt has ended: settled or parked (committed), or its lease
    # lost or handed back. The event its end recorded (G19) is tried once
    # now, holding no lease; a retry, or this process dying first, is the
    # reaper's. A run without a webhook has none: no statement for it.
    if claimed.request.get("webhook"):
        deliver_new_events_of(claimed.lease.run_id)
    if claimed.team_capped and claimed.spend is not None:
        _wake_held_runs_of(claimed.spend.team)


def _wake_held_runs_of(team_id: int) -> None:
    """The attempt no longer runs: a run its team's cap held back may take
    its place (G22). If this fails, the reaper's next pass wakes it."""
    try:
        wake_held_runs(team_id)
    except Exception:
        logger.exception("team=%s held runs not woken; the reaper's next pass will", team_id)


def _stored_request(stored: dict) -> RunRequest:
    # Stored requests were valid when enqueued; tools may since have been
    # removed or disabled, which the agent loop handles by not offering them.
    return RunRequest(
        prompt=stored["prompt"],
        tools=tuple(stored.get("tools", [])),
        provider=stored["provider"],
        max_iterations=stored["max_iterations"],
        require_approval=tuple(stored.get("require_approval", [])),
        max_total_tokens=stored.get("max_total_tokens"),
        max_cost=Decimal(stored["max_cost"]) if stored.get("max_cost") is not None else None,
        instructions=stored.get("instructions", ""),
        webhook=stored.get("webhook", ""),
    )


def _resumption(lease: Lease, stored: dict, disabled: frozenset[str]) -> tuple[RunRequest, Journal]:
    """What a re-executed attempt continues from: its request, checked again,
    and its journal (G12). Raises ``JournalUnreplayable`` rather than improvise."""
    try:
        request = parse_stored_request(stored)
    except InvalidRunRequest as error:
        raise JournalUnreplayable(f"the stored request no longer parses: {error}") from None
    return request, read_journal_of(lease.run_id, request, disabled=disabled)


def _approval_gate(
    lease: Lease, request: RunRequest, offered: dict, overrides: dict, journal: Journal
) -> ApprovalGate:
    """Which of the offered tools wait for approval in this attempt (the
    policy as the claim read it, and the request's additions), and — when
    it resumes a turn whose calls are not all done — that turn's decisions."""
    decisions = None
    if journal.turns and not journal.ends_with_final_answer:
        last = journal.turns[-1]
        if len(last.outcomes) < len(last.turn.tool_calls):
            decisions = Decisions.of_turn(lease.run_id, last.sequence)
    return ApprovalGate(
        lease.run_id,
        by_policy=tools_needing_approval(offered, overrides),
        by_request=frozenset(request.require_approval) & set(offered),
        decisions=decisions,
    )


def execute_attempt(
    lease: Lease,
    stored_request: dict,
    mode: str,
    *,
    requeue_count: int,
    resumed: bool,
    disabled_tools: frozenset[str],
    approval_overrides: dict,
    recorded_steps: int = 0,
    starting_spend: StartingSpend | None = None,
) -> None:
    """Drive the loop under ``lease``. A queued run's claim recorded its
    request step (``recorded_steps``); an interactive run records it here. A
    re-executed run resumes: it replays its journal and goes live after it
    (G12). A call that needs approval parks the run (G14). Each model call
    waits for the budget checks (G17), from what the claim read."""
    with (
        spans.attempt(lease, mode, resumed=resumed) as traced,
        heartbeat.kept(
            lease, settings.NRLLM_LEASE_SECONDS, settings.NRLLM_OPERATION_MARGIN_SECONDS
        ) as beat,
    ):
        execution = LeasedExecution(
            lease,
            settings.NRLLM_LEASE_SECONDS,
            settings.NRLLM_OPERATION_MARGIN_SECONDS,
            recorded_steps=recorded_steps,
            heartbeat=beat,
        )
        beat.starting()
        try:
            # Before the journal is read: it checks recorded calls against the
            # tools registered, which for MCP tools is what their servers list.
            require_available(stored_request.get("tools", []), disabled_tools)
            if resumed:
                request, journal = _resumption(lease, stored_request, disabled_tools)
            else:
                request, journal = _stored_request(stored_request), Journal()
            if starting_spend is not None:
                execution.budget_from(
                    BudgetWatch(
                        starting_spend,
                        max_total_tokens=request.max_total_tokens,
                        max_cost=request.max_cost,
                    )
                )
                if journal:
                    execution.budget.replayed(journal)
                execution.reservations = CallReservations.of(
                    lease, starting_spend, execution.budget.tally
                )
            offered = offered_tools(request.tools, disabled_tools)
            execution.approvals = _approval_gate(
                lease, request, offered, approval_overrides, journal
            )
            if mode == RunMode.INTERACTIVE:
                execution.record_request(stored_request)
            if journal:
                traced.replayed(journal)
                _note_resume(execution, journal)
            outcome = run_agent_loop(
                prompt=request.prompt,
                instructions=request.instructions,
                provider=_DeadlinedProvider(
                    build_provider(request.provider, attempt=lease.token),
                    request.provider["kind"],
                    execution,
                ),
                tools=offered,
                max_iterations=request.max_iterations,
                observer=execution,
                journal=journal.turns,
            )
            if not execution.settled and outcome.reason == TerminationReason.COMPLETED:
                # A replayed final answer, or one whose record the database
                # refused: settled as ``finish`` settles, so a pending cancel
                # still wins (G9).
                execution.finish_without_steps(outcome.output)
        except AwaitingInput as waiting:
            traced.ended(spans.AttemptEnd.WAITING_FOR_INPUT)
            logger.info(
                "run=%s waits for %s of %s",
                lease.run_id,
                waiting.request.kind,
                waiting.request.tool_name,
            )
            return
        except AwaitingApproval as waiting:
            traced.ended(spans.AttemptEnd.WAITING_FOR_APPROVAL)
            logger.info(
                "run=%s waits for approval of %d call(s)", lease.run_id, len(waiting.approvals)
            )
            approval_notices.run_waits(lease.run_id, waiting.approvals)
            return
        except LeaseLost:
            traced.ended(spans.AttemptEnd.LEASE_LOST)
            LEASES_LOST.inc()
            logger.warning(
                "run=%s lease_token=%s lost; settling nothing", lease.run_id, lease.token
            )
            return
        except RunCancelled as cancel:
            traced.ended(spans.AttemptEnd.CANCELLED)
            withdraw_unstarted(lease, cancel)
            transitions.settle(lease, RunStatus.CANCELLED, TerminationReason.CANCELLED)
            return
        except JournalUnreplayable as error:
            traced.ended(spans.AttemptEnd.JOURNAL_UNREPLAYABLE, error)
            dead_letter_unreplayable(lease, error)
            return
        except Exception as error:
            traced.ended(spans.AttemptEnd.FAILED, error)
            settle_failure(lease, error, mode, requeue_count=requeue_count)
            return
        finally:
            # What a failed or abandoned call reserved (G21); a settled one is gone.
            execution.release_reservation()
        traced.ended(outcome.reason)
        if not execution.settled:
            transitions.settle(lease, RunStatus.FAILED, outcome.reason)


class _DeadlinedProvider(TimedProvider):
    """The run's provider, timed, with each call's deadline told to the
    heartbeat: the lease is kept through the call up to its client's own
    timeouts plus the margin, and a lease further once it returned (G16)."""

    def __init__(self, provider, kind: str, execution: LeasedExecution):
        super().__init__(provider, kind)
        self._call_seconds = getattr(provider, "call_seconds", None)
        self._execution = execution
        self._model = getattr(provider, "model", None)  # the one asked for, if named
        options = getattr(provider, "options", None)
        self._max_tokens = (options or {}).get("max_tokens")
        if self._max_tokens is None and options is not None and execution.sizes_calls:
            # Its calls are sized by this bound (G17, G21): the model is held
            # to it, or an honest answer longer than it passes a limit.
            self._max_tokens = settings.NRLLM_RESERVE_MAX_TOKENS
            provider.options = {**options, "max_tokens": self._max_tokens}
        #: The configuration's shared rate limit, if one is set (None: none).
        self._rate_limit = rate_limit.calls_for(
            provider, kind, execution.lease, execution.heartbeat
        )

    def next_turn(self, messages, tool_specs):
        size = self._execution.call_size(messages, tool_specs, self._max_tokens)
        if self._rate_limit is None:
            self._execution.reserve_call(size)
        self._execution.model_call_begins(self._call_seconds, size)
        try:
            if self._rate_limit is None:
                return self._traced_turn(messages, tool_specs)
            # Reserved (G21) once the limit lets the call go, each time it is
            # sent: held through the wait, a reservation would keep the
            # submitter's other runs from calls they may make now.
            return self._rate_limit.call(
                lambda: self._reserved_turn(messages, tool_specs, size),
                messages,
                self._call_seconds,
            )
        except BaseException:
            self._execution.release_reservation()
            raise
        finally:
            self._execution.between_operations()

    def _reserved_turn(self, messages, tool_specs, size):
        self._execution.reserve_call(size)
        self._execution.model_call_begins(self._call_seconds, size)
        try:
            return self._traced_turn(messages, tool_specs)
        except BaseException:
            # A 429 sent again after its pause reserves again then.
            self._execution.release_reservation()
            raise

    def _traced_turn(self, messages, tool_specs):
        started = time.monotonic()
        with spans.model_call(self._execution.lease, self._kind, self._model) as traced:
            return traced.returned(_timed(super().next_turn(messages, tool_specs), started))


def _timed(turn: Turn, started: float) -> Turn:
    """``turn`` with its call's latency as the worker timed it, where its
    provider recorded none (the scripted one does not): every live model
    turn's step says how long its call took, which the run page adds up as
    its time in model calls."""
    if "latency_ms" in turn.meta:
        return turn
    latency_ms = int((time.monotonic() - started) * 1000)
    return dataclasses.replace(turn, meta={**turn.meta, "latency_ms": latency_ms})


def _note_resume(execution: LeasedExecution, journal: Journal) -> None:
    logger.info("run=%s %s", execution.lease.run_id, journal.describe())
    RESUMES.inc()
    REPLAYED_STEPS.labels(StepKind.LLM).inc(len(journal.turns))
    REPLAYED_STEPS.labels(StepKind.TOOL).inc(journal.tool_results)
    execution.after_step(journal.resume_event())
