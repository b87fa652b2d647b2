"""A property-based state machine over the guarded transitions, against a
reference model: at most one owner, terminal stays terminal, a fenced
non-idempotent write is never requeued, a lost owner writes nothing — and
the journal a resumed attempt replays (G12) is exactly the model turns and
tool outcomes its owners recorded since the last restart, whatever
claims, reaps, requeues and lost owners came in between; one with a hole
is refused, never replayed."""

import functools
import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from runs import transitions
from runs.models import AgentRun
from runs.reaper import reap_stale_runs
from runs.reaper.retention import delete_whole_runs
from runs.runtime.journal import JournalUnreplayable, read_journal
from runs.transitions import CancelOutcome, RecordOutcome
from tools.contract import idempotency_key_for

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

WORKERS = st.sampled_from(["w1", "w2", "w3"])
EFFECTS = st.sampled_from(["", "idempotent_write", "non_idempotent_write"])
TERMINAL = {"completed", "failed", "cancelled"}
MAX_REQUEUES = 2
LEASE = 60


class RunLifecycle(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        run = transitions.create_queued_run({"prompt": "p"}, "p")
        self.run_id = run.pk
        self.leases: dict[str, transitions.Lease] = {}
        self.claims = itertools.count()
        # The reference model.
        self.status = "queued"
        self.token = 0
        self.owner = ""
        self.fence = ""
        self.cancel_requested = False
        self.requeues = 0
        #: Times the run was put in the queue: its jobs' ids never repeat.
        self.dispatches = 0
        self.steps = 0
        self.expired = False
        self.ended_as = None
        #: The journal since the last restart: [calls asked for, outcomes
        #: recorded] per model turn, its steps by kind, its last step, and
        #: whether it has a hole.
        self.journal: list[list[int]] = []
        self.journal_steps = {"llm": 0, "tool": 0}
        self.journal_last = 0
        self.hole = False

    def teardown(self):
        # Examples share one database transaction: leave nothing for the next.
        delete_whole_runs([self.run_id])

    def _current(self, worker) -> bool:
        lease = self.leases.get(worker)
        return (
            lease is not None
            and self.status == "running"
            and (lease.owner, lease.token) == (self.owner, self.token)
        )

    def _end(self, status):
        self.status, self.owner = status, ""
        self.ended_as = status

    # --- workers ----------------------------------------------------------

    @initialize(journal=st.booleans())
    def start(self, journal):
        """Half the examples start with an attempt that recorded a model turn
        and its call's outcome, so requeues and restarts meet a journal often."""
        if journal:
            self.claim("w1")
            self.record_model_turn("w1", 1, False)
            self.record_tool_outcome("w1", False)

    @rule(worker=WORKERS)
    def claim(self, worker):
        claimed = transitions.claim(self.run_id, f"{worker}-{next(self.claims)}", LEASE)
        if self.status == "queued":
            assert claimed is not None and claimed.lease.token == self.token + 1
            assert claimed.resumed == (self.steps > 0)
            self.steps += 1  # the claim records the attempt's request step
            if claimed.resumed:
                self._check_the_journal()
            lease = claimed.lease
            self.leases[worker] = lease
            self.status, self.owner, self.token = "running", lease.owner, lease.token
            self.fence, self.expired = "", False
        else:
            assert claimed is None

    @rule(worker=WORKERS, fence=EFFECTS)
    def renew_before_tool(self, worker, fence):
        lease = self.leases.get(worker)
        if lease is None:
            return
        renewed = transitions.renew_lease(lease, LEASE, fence=fence)
        assert renewed == (self._current(worker) and not self.cancel_requested)
        if renewed:
            self.fence, self.expired = fence, False

    @rule(worker=WORKERS)
    def heartbeat_keeps_the_lease(self, worker):
        """A keeper thread's renewal (G16): the current owner's lease runs on,
        a lost owner's changes nothing, and nothing else moves."""
        lease = self.leases.get(worker)
        if lease is None:
            return
        kept = transitions.keep_leases([(lease, LEASE * 2)], when_left=LEASE * 2) == 1
        assert kept == self._current(worker)
        if kept:
            self.expired = False

    @rule(worker=WORKERS)
    def worker_hands_the_run_back(self, worker):
        """A draining worker past its grace (G15): the lease lapses now, the
        run stays as it is for the reaper, and a lost owner changes nothing."""
        lease = self.leases.get(worker)
        if lease is None:
            return
        handed = transitions.hand_back(lease)
        assert handed == self._current(worker)
        if handed:
            self.expired = True

    def _record(self, worker, step, clear_fence) -> bool:
        lease = self.leases.get(worker)
        if lease is None:
            return False
        outcome = transitions.record_step(lease, LEASE, step, clear_fence=clear_fence)
        if not self._current(worker):
            assert outcome is RecordOutcome.LEASE_LOST
            return False
        expected = (
            RecordOutcome.PERSISTED_CANCEL_REQUESTED
            if self.cancel_requested
            else RecordOutcome.PERSISTED
        )
        assert outcome is expected
        self.steps += 1
        self.expired = False
        if clear_fence:
            self.fence = ""
        return True

    @rule(worker=WORKERS, calls=st.integers(0, 2), clear_fence=st.booleans())
    def record_model_turn(self, worker, calls, clear_fence):
        asked = [{"name": "search_notes", "arguments": {"query": str(n)}} for n in range(calls)]
        step = {"kind": "llm", "result": {"content": "", "tool_calls": asked}}
        if self._record(worker, step, clear_fence):
            if self.journal and self.journal[-1][1] < self.journal[-1][0]:
                self.hole = True  # calls of the turn before have no outcome
            if self.journal and self.journal[-1][0] == 0:
                self.hole = True  # a turn after a final answer
            self.journal.append([calls, 0])
            self._journal_step("llm")

    @rule(worker=WORKERS, clear_fence=st.booleans())
    def record_tool_outcome(self, worker, clear_fence):
        # The key of the call this outcome answers: the next call of the last turn.
        index = self.journal[-1][1] if self.journal else 0
        position = f"{len(self.journal)}.{index}"
        key = idempotency_key_for(str(self.run_id), position, "search_notes", {"query": str(index)})
        step = {
            "kind": "tool",
            "tool_name": "search_notes",
            "effect": "read_only",
            "result": {},
            "idempotency_key": key,
        }
        if self._record(worker, step, clear_fence):
            if not self.journal or self.journal[-1][1] >= self.journal[-1][0]:
                self.hole = True  # an outcome no call asked for
            else:
                self.journal[-1][1] += 1
            self._journal_step("tool")

    def _journal_step(self, kind):
        self.journal_steps[kind] += 1
        self.journal_last = self.steps

    def _check_the_journal(self):
        """A resumed attempt replays exactly what was recorded since the last
        restart, or refuses a journal with a hole."""
        replay = functools.partial(
            read_journal,
            self.run_id,
            registered={"search_notes"},
            disabled=(),
            max_iterations=99,
            requested=("search_notes",),
        )
        if self.hole:
            with pytest.raises(JournalUnreplayable):
                replay()
            return
        journal = replay()
        assert (journal.model_turns, journal.tool_results, journal.last_sequence) == (
            self.journal_steps["llm"],
            self.journal_steps["tool"],
            self.journal_last,
        )
        assert [
            [len(turn.turn.tool_calls), len(turn.outcomes)] for turn in journal.turns
        ] == self.journal

    @rule(worker=WORKERS, status=st.sampled_from(sorted(TERMINAL)))
    def settle(self, worker, status):
        lease = self.leases.get(worker)
        if lease is None:
            return
        settled = transitions.settle(lease, status, "completed")
        assert settled == self._current(worker)
        if settled:
            # A failure with a cancel pending ends cancelled (G9), unless a
            # non-idempotent write is in doubt.
            cancel_wins = self.cancel_requested and self.fence != "non_idempotent_write"
            self._end("cancelled" if status == "failed" and cancel_wins else status)

    @rule(worker=WORKERS)
    def requeue_for_retry(self, worker):
        lease = self.leases.get(worker)
        if lease is None:
            return
        dispatch = transitions.requeue_for_retry(
            lease, failure_class="connection", error_type="E", error_message=""
        )
        allowed = self._current(worker) and self.fence != "non_idempotent_write"
        if allowed and self.cancel_requested:
            # The cancel wins over the retry (G9).
            assert dispatch is None
            self._end("cancelled")
            return
        assert (dispatch is not None) == allowed
        if dispatch is not None:
            self.status, self.owner, self.fence = "queued", "", ""
            self.requeues += 1
            self.dispatches += 1
            assert dispatch == self.dispatches

    # --- operators, time and the reaper ------------------------------------

    def _operator_step(self, transition) -> bool:
        row = AgentRun.objects.get(pk=self.run_id)
        done = (
            transition(
                self.run_id,
                seen_status=row.status,
                seen_step_count=row.step_count,
                step={"kind": "operator", "result": {"action": transition.__name__}},
            )
            is not None
        )
        assert done == (self.status in ("failed", "cancelled"))
        if done:
            self.status, self.owner, self.fence = "queued", "", ""
            self.requeues, self.cancel_requested, self.ended_as = 0, False, None
            self.dispatches += 1  # a fresh budget, never a job id used before
            self.steps += 1
        return done

    @rule()
    def operator_requeue(self):
        if self._operator_step(transitions.operator_requeue):
            self._check_the_journal()  # what the verdict says the requeue resumes

    @rule()
    def operator_restart(self):
        if self._operator_step(transitions.operator_restart):
            self.journal, self.hole = [], False
            self.journal_steps = {"llm": 0, "tool": 0}
            self.journal_last = 0
            self._check_the_journal()

    @rule()
    def cancel(self):
        outcome = transitions.cancel(self.run_id)
        if self.status == "queued":
            assert outcome is CancelOutcome.CANCELLED
            self._end("cancelled")
        elif self.status == "running":
            expected = (
                CancelOutcome.ALREADY_REQUESTED
                if self.cancel_requested
                else CancelOutcome.REQUESTED
            )
            assert outcome is expected
            self.cancel_requested = True
        else:
            assert outcome is CancelOutcome.TERMINAL

    @rule()
    def time_passes_beyond_the_lease(self):
        AgentRun.objects.filter(pk=self.run_id, status="running").update(
            lease_expires_at="2000-01-01T00:00:00Z"
        )
        if self.status == "running":
            self.expired = True

    @rule()
    def reap(self):
        report = reap_stale_runs()
        if not (self.status == "running" and self.expired):
            assert report.decisions == {}
            return
        self.steps += 1
        if self.fence == "non_idempotent_write":
            self._end("failed")
        elif self.cancel_requested:
            self._end("cancelled")
        elif self.requeues >= MAX_REQUEUES:
            self._end("failed")
        else:
            self.status, self.owner, self.fence = "queued", "", ""
            self.requeues += 1
            self.dispatches += 1
        assert len(report.decisions) == 1

    # --- what must always hold ----------------------------------------------

    @invariant()
    def the_row_matches_the_model(self):
        row = AgentRun.objects.get(pk=self.run_id)
        assert (row.status, row.lease_token, row.lease_owner) == (
            self.status,
            self.token,
            self.owner,
        )
        assert (row.pending_effect, row.requeue_count, row.step_count) == (
            self.fence,
            self.requeues,
            self.steps,
        )
        assert (row.cancel_requested_at is not None) == self.cancel_requested
        assert row.dispatch_count == self.dispatches

    @invariant()
    def at_most_one_worker_owns_the_run(self):
        assert sum(self._current(worker) for worker in self.leases) <= 1

    @invariant()
    def terminal_stays_terminal(self):
        if self.ended_as is not None:
            assert AgentRun.objects.get(pk=self.run_id).status == self.ended_as


def test_transitions_follow_the_reference_model(settings_override):
    run_state_machine_as_test(
        RunLifecycle,
        settings=settings(
            max_examples=150,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


@pytest.fixture
def settings_override(settings):
    settings.NRLLM_MAX_REQUEUES = MAX_REQUEUES
    # Lost-job redispatch would execute the run in-process; not modelled here.
    settings.NRLLM_REDISPATCH_AFTER_SECONDS = 10**7
