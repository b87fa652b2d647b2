"""Starting runs: ``enqueue`` stores a queued run and dispatches its job
after commit; ``run`` executes an interactive run inline, in its caller.

Both take a request (``run_request``'s format) and, when it was expanded
from an agent's version (``agents.starting``), that version: the run
records it (G18), and its stored request is what the version defined, so
no later edit of the agent changes what the run or its resume uses.
"""

import contextlib
import logging
import signal
import threading

from django.conf import settings
from django.db import DatabaseError, transaction

from runs import transitions
from runs.models import AgentRun
from runs.models.vocabulary import RunMode, RunStatus, SubmittedVia, TerminationReason
from runs.queue.dispatch import dispatch_or_fail
from runs.runtime.attempt import execute_attempt, worker_identity
from runs.runtime.enqueue_spend import check_spend_at_enqueue
from runs.runtime.run_request import parse_run_request
from runs.runtime.team_rules import under_team_rules
from runs.transitions import Lease
from spend.starting import starting_spend_of
from teams.models import DEFAULT_TEAM_ID
from tools.enabled import approval_overrides

logger = logging.getLogger(__name__)


def enqueue(
    request_data,
    *,
    submitted_by=None,
    submitted_via: str = SubmittedVia.COMMAND_LINE,
    agent_version=None,
    team=None,
) -> AgentRun:
    """Validate and store a ``queued`` run; its job is dispatched after commit.
    ``submitted_by`` (a user, or None from the command line),
    ``submitted_via`` and ``agent_version`` are recorded with it (four-eyes
    approval reads the first two). ``team``: the team it is started in,
    whose rules it follows (None: the default team, without rules).

    Raises ``InvalidRunRequest`` and stores nothing when the request is bad,
    and ``BudgetRefused`` when its submitter's budget or its team's is
    spent (G17, G21).
    """
    run_request = under_team_rules(parse_run_request(request_data), team)
    check_spend_at_enqueue(run_request, submitted_by, team_id=_team_id(team))
    # One INSERT, atomic on its own. Inside a caller's transaction the job
    # waits for the caller's commit; outside one, Django runs it at once.
    run = transitions.create_queued_run(
        run_request.as_json(),
        run_request.prompt,
        submitted_by=submitted_by,
        submitted_via=submitted_via,
        agent_version=agent_version,
        team_id=None if team is None else team.pk,
    )
    transaction.on_commit(
        lambda: dispatch_or_fail(run.pk, dispatch_count=run.dispatch_count, team_id=run.team_id)
    )
    return run


def run(
    request_data,
    *,
    submitted_by=None,
    submitted_via: str = SubmittedVia.COMMAND_LINE,
    agent_version=None,
    team=None,
) -> AgentRun:
    """Execute an ``interactive`` run inline, under a lease, and return it:
    ended, or ``waiting_for_approval`` / ``waiting_for_input`` (a worker
    finishes it once its calls are decided or answered, G14, G24)."""
    run_request = under_team_rules(parse_run_request(request_data), team)
    check_spend_at_enqueue(run_request, submitted_by, team_id=_team_id(team))
    lease = transitions.begin_interactive(
        run_request.as_json(),
        run_request.prompt,
        worker_identity(),
        settings.NRLLM_LEASE_SECONDS,
        submitted_by=submitted_by,
        submitted_via=submitted_via,
        agent_version=agent_version,
        team_id=None if team is None else team.pk,
    )
    try:
        # parse_run_request has just refused any disabled tool.
        execute_attempt(
            lease,
            run_request.as_json(),
            RunMode.INTERACTIVE,
            requeue_count=0,
            resumed=False,
            disabled_tools=frozenset(),
            approval_overrides=approval_overrides(run_request.tools),
            starting_spend=starting_spend_of(AgentRun.objects.get(pk=lease.run_id)),
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


def _team_id(team) -> int:
    """The id of the team a run is started in: ``team``'s, or the default
    team's (None), where the run is stored."""
    return DEFAULT_TEAM_ID if team is None else team.pk
