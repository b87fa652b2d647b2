"""A property-based state machine over the guarded transitions, against a
reference model: at most one owner, terminal stays terminal, a fenced
non-idempotent write is never requeued, a lost owner writes nothing."""

import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from runs import transitions
from runs.models import AgentRun
from runs.reaper import reap_stale_runs
from runs.transitions import CancelOutcome, RecordOutcome

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
        self.steps = 0
        self.expired = False
        self.ended_as = None

    def teardown(self):
        # Examples share one database transaction: leave nothing for the next.
        AgentRun.objects.filter(pk=self.run_id).delete()

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

    @rule(worker=WORKERS)
    def claim(self, worker):
        claimed = transitions.claim(self.run_id, f"{worker}-{next(self.claims)}", LEASE)
        if self.status == "queued":
            assert claimed is not None and claimed.lease.token == self.token + 1
            assert claimed.resumed == (self.steps > 0)
            self.steps += 1  # the claim records the attempt's request step
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

    @rule(worker=WORKERS, clear_fence=st.booleans())
    def record_step(self, worker, clear_fence):
        lease = self.leases.get(worker)
        if lease is None:
            return
        outcome = transitions.record_step(lease, LEASE, {"kind": "llm"}, clear_fence=clear_fence)
        if not self._current(worker):
            assert outcome is RecordOutcome.LEASE_LOST
            return
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

    @rule(worker=WORKERS, status=st.sampled_from(sorted(TERMINAL)))
    def settle(self, worker, status):
        lease = self.leases.get(worker)
        if lease is None:
            return
        settled = transitions.settle(lease, status, "completed")
        assert settled == self._current(worker)
        if settled:
            self._end(status)

    @rule(worker=WORKERS)
    def requeue_for_retry(self, worker):
        lease = self.leases.get(worker)
        if lease is None:
            return
        requeued = transitions.requeue_for_retry(
            lease, failure_class="connection", error_type="E", error_message=""
        )
        assert requeued == (self._current(worker) and self.fence != "non_idempotent_write")
        if requeued:
            self.status, self.owner, self.fence = "queued", "", ""
            self.requeues += 1

    # --- operators, time and the reaper ------------------------------------

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
