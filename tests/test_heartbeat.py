"""G16: while a run is in flight its short lease is kept in the background,
never past the deadline of what the attempt is doing now; a worker whose
heartbeat is lost is fenced.

Real PostgreSQL; the attempts run in this process (a thread where a test
needs to watch them), the reaper is called as its cron job calls it.
"""

import dataclasses
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from runs import transitions
from runs.models import AgentRun
from runs.models.vocabulary import RunStatus
from runs.reaper import reap_stale_runs
from runs.runtime import heartbeat, run
from runs.runtime.step_ledger import StepLedger
from runs.transitions import RecordOutcome
from tests.drifting_model import SEARCH, openai_request
from tests.helpers import answer, scripted, stored, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def lease_left(run_id) -> float:
    """Seconds the run's lease has left, by the database's clock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM lease_expires_at - now()) FROM runs_agentrun WHERE id = %s",
            [run_id],
        )
        return float(cursor.fetchone()[0])


def lease_clock(run_id) -> tuple[float, float]:
    """The database's time now and the run's lease expiry, in seconds."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM now()), EXTRACT(EPOCH FROM lease_expires_at) "
            "FROM runs_agentrun WHERE id = %s",
            [run_id],
        )
        now, expires = cursor.fetchone()
        return float(now), float(expires)


def test_a_short_lease_is_kept_through_a_model_call_longer_than_it(settings):
    """A lease of 2 s, a model that takes 4 s: the reaper, passing all the
    while, never finds the run stale, and the run completes. (The keeper
    renews a lease by the time a third of it is left: 0.7 s of a 2 s lease
    is time enough on a loaded host, 0.3 s of a 1 s one not always.)"""
    settings.NRLLM_LEASE_SECONDS = 2
    finished = threading.Event()

    def execute():
        try:
            run(scripted({"content": "slow", "delay_seconds": 4}))
        finally:
            connection.close()
            finished.set()

    threading.Thread(target=execute).start()
    reaped = []
    while not finished.wait(0.2):
        reaped.append(reap_stale_runs().decisions)
    assert not any(reaped), reaped
    assert AgentRun.objects.get().status == RunStatus.COMPLETED


def test_the_record_before_a_tool_renews_a_lease_and_the_heartbeat_carries_it(settings):
    """The step before a tool renews the lease for a lease, not for the
    tool's 600 s limit: a worker that dies in the tool is noticed in a lease
    (the heartbeat extends it while the worker lives)."""
    settings.NRLLM_TOOLS = ["tests.tools_for_tests.LeaseProbe"]
    settings.NRLLM_LEASE_SECONDS = 5
    agent_run = run(
        scripted({"tool_calls": [{"name": "lease_probe"}]}, answer(), tools=["lease_probe"])
    )
    remaining = agent_run.steps.get(kind="tool").result["lease_remaining_seconds"]
    assert 4 < remaining <= 5
    assert agent_run.status == RunStatus.COMPLETED


def test_the_heartbeat_stops_at_the_operations_deadline_and_the_stuck_worker_is_fenced(
    settings,
):
    """An attempt stuck past its operation's deadline: the keeper stops
    renewing, the lease lapses, the reaper requeues the run, and the stuck
    attempt's late record is refused. The lease is watched by the database's
    clock until it lapses: what the keeper did, not when the test looked."""
    settings.NRLLM_MAX_REQUEUES = 3
    settings.NRLLM_EXECUTE_IN_CALLER = False  # the requeued run stays queued
    agent_run = transitions.create_queued_run(stored(scripted(answer())), "p")
    lease = transitions.claim(agent_run.pk, "stuck-worker", 2).lease
    with heartbeat.kept(lease, 2) as beat:
        start, claimed_until = lease_clock(agent_run.pk)
        beat.until(3)  # the operation's deadline: 3 s from now
        seen = []

        def lapsed() -> bool:
            seen.append(lease_clock(agent_run.pk))
            now, expires = seen[-1]
            return expires <= now

        wait_until(lapsed, timeout=30, what="the lease to lapse")
        # Kept: alive after the claim's own 2 s had run out ...
        assert any(now > claimed_until and expires > now for now, expires in seen), seen
        # ... and never past the deadline (3 s, and a renewal's own latency).
        assert max(expires for _, expires in seen) - start < 4.5, "kept past the deadline"
        reap_stale_runs()
    assert AgentRun.objects.get(pk=agent_run.pk).status == RunStatus.QUEUED
    outcome = transitions.record_step(lease, 1, {"kind": "llm"}, clear_fence=False)
    assert outcome is RecordOutcome.LEASE_LOST


def test_a_handed_back_attempt_settles_nothing_and_lets_its_lease_lapse(settings, drifting_model):
    """``hand_back_all`` during a model call: the lease lapses at once for
    the reaper, and the attempt stops at its next step boundary (the turn's
    record) without settling. The model holds its answer until the hand-back
    is done, so the hand-back lands inside the call however busy the host."""
    settings.NRLLM_LEASE_SECONDS = 30
    drifting_model.hold_turn(0)
    done = threading.Event()

    def execute():
        try:
            run(
                openai_request(
                    "hand back", [{"calls": [SEARCH]}, {"answer": "no"}], ["search_notes"]
                )
            )
        finally:
            connection.close()
            done.set()

    threading.Thread(target=execute).start()
    assert drifting_model.held.wait(timeout=30), "the model call never began"
    assert heartbeat.hand_back_all() == 1
    agent_run = AgentRun.objects.get()
    assert lease_left(agent_run.pk) <= 0
    drifting_model.release.set()
    assert done.wait(30)
    agent_run.refresh_from_db()
    assert agent_run.status == RunStatus.RUNNING  # not settled as if it ended
    assert lease_left(agent_run.pk) <= 0  # the model's turn recorded, the lease let go
    assert list(agent_run.steps.values_list("kind", flat=True)) == ["request", "llm"]
    assert drifting_model.requests_by_turn == {0: 1}  # nothing asked after the hand-back


def test_one_keeper_pass_renews_every_due_lease_in_one_statement_each_to_its_own_deadline():
    """Eight attempts in flight, one pass, one UPDATE: each due lease is
    carried to its own operation's deadline; a lease with more left than its
    renewal would give, one taken by another token, one past its deadline
    and one handed back are left as they are. Attempts whose own records
    just renewed their leases cost no statement at all."""
    keeper = heartbeat._Keeper()  # its thread not started: the test is the tick
    keeper.tick = 10  # renewed when less than 20 s (or the beat's seconds) is left

    def attempt(lease_seconds: float, *, deadline: float) -> heartbeat.Heartbeat:
        agent_run = transitions.create_queued_run(stored(scripted(answer())), "p")
        lease = transitions.claim(agent_run.pk, "keeper-worker", 1).lease
        transitions.heartbeat(lease, lease_seconds)
        beat = heartbeat.Heartbeat(lease, 30)
        beat.until(deadline)
        keeper.beats.add(beat)
        return beat

    long_call = attempt(1, deadline=25)
    short_call = attempt(1, deadline=8)
    long_call_due = attempt(15, deadline=25)  # 15 s left: less than 20
    short_call_not_due = attempt(15, deadline=8)  # 15 s left: more than its 8
    renewed_further = attempt(60, deadline=25)
    taken = attempt(1, deadline=25)
    taken.lease = dataclasses.replace(taken.lease, token=taken.lease.token + 1)
    past_deadline = attempt(1, deadline=-1)
    handed_back = attempt(1, deadline=25)
    handed_back.handed_back = True

    with CaptureQueriesContext(connection) as queries:
        assert keeper.renew_due() == 3
    assert [query["sql"].split()[0] for query in queries] == ["UPDATE"]
    assert 24 < lease_left(long_call.lease.run_id) <= 25
    assert 7 < lease_left(short_call.lease.run_id) <= 8
    assert 24 < lease_left(long_call_due.lease.run_id) <= 25
    assert 14 < lease_left(short_call_not_due.lease.run_id) <= 15  # never shortened
    assert 59 < lease_left(renewed_further.lease.run_id) <= 60
    for beat in (taken, past_deadline, handed_back):
        assert lease_left(beat.lease.run_id) <= 1

    # Attempts whose own records renewed their leases since cost no statement.
    keeper.beats.clear()
    for _ in range(2):
        beat = attempt(1, deadline=25)
        sent_at = time.monotonic()
        transitions.heartbeat(beat.lease, 30)  # as a record renews it
        beat.renewed(30, sent_at)
    with CaptureQueriesContext(connection) as queries:
        assert keeper.renew_due() == 0
    assert not queries


def test_a_renewal_a_server_crash_may_lose_leaves_the_keeper_renewing():
    """A record that did not wait for the flush renewed the lease, and a
    server crash lost its commit (G12): the lease is where an earlier
    statement left it. The keeper does not count on the lost renewal."""
    keeper = heartbeat._Keeper()
    keeper.tick = 10
    agent_run = transitions.create_queued_run(stored(scripted(answer())), "p")
    lease = transitions.claim(agent_run.pk, "keeper-worker", 30).lease
    beat = heartbeat.Heartbeat(lease, 30)
    beat.model_call(120)
    keeper.beats.add(beat)
    ledger = StepLedger(lease, recorded=1)
    ledger.renewed = beat.renewed
    turn = {"kind": "llm", "tool_name": "", "effect": "", "arguments": None}
    turn |= {"result": {"content": "x"}, "error": "", "idempotency_key": ""}
    assert ledger.record([turn], 30, None) is RecordOutcome.PERSISTED
    # The crash: the lease as the claim, 25 s ago, left it.
    AgentRun.objects.filter(pk=lease.run_id).update(lease_expires_at=Now() + timedelta(seconds=5))
    assert keeper.renew_due() == 1
    assert lease_left(lease.run_id) > 29


def test_one_pass_never_gives_a_lease_the_expiry_of_another_attempt_under_its_token():
    """A token a server crash handed out twice names two attempts: the row
    one's guard matched is renewed by that one, never shortened by the other."""
    agent_run = transitions.create_queued_run(stored(scripted(answer())), "p")
    lease = transitions.claim(agent_run.pk, "current", 10).lease
    previous = dataclasses.replace(lease, owner="previous")
    assert transitions.keep_leases([(previous, 1), (lease, 30)], when_left=20) == 1
    assert lease_left(lease.run_id) > 29


def test_the_statement_other_databases_get_renews_as_postgresqls_does():
    """``keep_leases`` sends PostgreSQL its leases as arrays and other
    databases (SQLite: the embedded default) a term per lease: the same
    renewals, each run here under both, end the same."""
    from runs.transitions import kept_leases

    def leases(seconds_left: list[float]) -> list:
        claimed = []
        for left in seconds_left:
            agent_run = transitions.create_queued_run(stored(scripted(answer())), "p")
            lease = transitions.claim(agent_run.pk, "keeper-worker", 1).lease
            transitions.heartbeat(lease, left)
            claimed.append(lease)
        return claimed

    # (lease left now, the renewal's seconds): due and renewed to 25; due
    # and capped at 8; 15 left of an 8 s renewal (never shortened); 60 left;
    # another attempt under the token; another owner.
    cases = [(1, 25), (1, 8), (15, 8), (60, 25), (1, 25), (1, 25)]
    results = []
    for keep in (kept_leases._keep_leases_as_arrays, kept_leases._keep_leases_term_by_term):
        claimed = leases([left for left, _ in cases])
        claimed[4] = dataclasses.replace(claimed[4], token=claimed[4].token + 1)
        claimed[5] = dataclasses.replace(claimed[5], owner="another-worker")
        renewed = keep(
            [(lease, seconds) for lease, (_, seconds) in zip(claimed, cases, strict=True)],
            20,
        )
        results.append((renewed, [round(lease_left(lease.run_id)) for lease in claimed]))
    assert results[0] == results[1] == (2, [25, 8, 15, 60, 1, 1])
