"""Edges of the recovery guarantees that an adversarial review of issue 16
found (G4, G7, G10, G11): runs and reconciliations from before migration
0014, an interactive run an operator handed to the workers, a Redis that
refuses writes for a while, a database refusing an admin action."""

import importlib
import shutil
import socket
import subprocess
import time

import pytest
from django.apps import apps as django_apps

from runs import transitions
from runs.models import AgentRun, RunStep, WriteReconciliation
from runs.models.selectors import writes_in_doubt
from runs.operators import actions as operator_actions
from runs.operators.requeue_safety import requeue_safety
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue, run
from runs.runtime.run_request import parse_run_request
from tests.helpers import answer, free_port, fresh, later, scripted

pytestmark = pytest.mark.django_db(transaction=True)


# --- Migration 0014 binds an old reconciliation to a later write (G10) -------


def test_migration_0014_does_not_bind_an_old_reconciliation_to_a_later_doubt(operator):
    """Before 0014 a run had one reconciliation whatever happened after it
    (the defect of issue 16 item 1). A run reconciled ``not_applied`` at
    attempt 1, requeued, and left in doubt again on the same call by
    attempt 2 is exactly what that defect produced. 0014's carry_over binds
    the old reconciliation to the run's *current* lease token, so attempt
    2's write in doubt counts as reconciled: it is not listed and may be
    requeued (its write runs a third time) without anyone looking at it."""
    migration = importlib.import_module("runs.migrations.0014_recovery_holes")
    agent_run = transitions.create_queued_run(parse_run_request(scripted(answer())).as_json(), "p")
    key = "k" * 64
    call = {"tool": "send_notification", "arguments": {"m": "x"}, "idempotency_key": key}
    # Attempt 1 left the write in doubt and was reconciled not_applied ...
    WriteReconciliation.objects.create(
        run=agent_run,
        lease_token=0,  # what AddField(default=0) leaves before carry_over
        outcome="not_applied",
        note="not received",
        tool_name="send_notification",
        arguments=call["arguments"],
        idempotency_key=key,
        operator=operator,
    )
    for sequence, (token, kind) in enumerate(
        [(1, "request"), (1, "llm"), (1, "operator"), (1, "operator"), (2, "request")],
        start=1,
    ):
        RunStep.objects.create(run=agent_run, sequence=sequence, lease_token=token, kind=kind)
    # ... then requeued; attempt 2 ran the same call again and was killed in it.
    AgentRun.objects.filter(pk=agent_run.pk).update(
        status="failed",
        termination_reason="write_interrupted",
        lease_token=2,
        step_count=5,
        pending_effect="non_idempotent_write",
        pending_call=call,
    )

    migration.carry_over(django_apps, None)

    stranded = AgentRun.objects.filter(pk=agent_run.pk)
    assert writes_in_doubt(stranded).exists(), "attempt 2's write is in doubt, not reconciled"
    assert requeue_safety(fresh(agent_run)).code == "write_in_doubt"


# --- An operator-requeued interactive run is reaped as a caller's (G7/G12) ---


def test_an_operator_requeued_interactive_run_whose_worker_died_is_requeued_not_abandoned(
    operator,
):
    """G12: a reaper requeue resumes every re-execution; G7's "interactive:
    its caller is gone" is about runs a caller executes. An interactive run
    an operator requeued is executed by a worker as a queued run
    (runtime.run_queued, RunMode.QUEUED), but its row keeps
    mode='interactive': when that worker dies, the reaper ends it
    failed/abandoned instead of requeuing it."""
    agent_run = run(scripted({"error": "server_error", "attempts": 1}, answer("ok")))
    assert (agent_run.status, agent_run.mode) == ("failed", "interactive")
    # Requeued by the operator with no worker (no REDIS_URL would execute it
    # in place): queue it through the transition, as the action does.
    step = {"kind": "operator", "result": {"action": "requeue"}}
    assert transitions.operator_requeue(
        agent_run.pk, seen_status="failed", seen_step_count=agent_run.step_count, step=step
    )
    # A worker claims it and is SIGKILLed mid-call: nothing renews the lease.
    assert transitions.claim(agent_run.pk, "worker-killed", 60) is not None
    reap_stale_runs(as_of=later())
    # Requeued, and (no Redis) resumed in place by the reaper's dispatch.
    reaped = fresh(agent_run)
    assert (reaped.status, reaped.termination_reason, reaped.mode) == (
        "completed",
        "completed",
        "queued",
    )


# --- A transient Redis refusal fails the run dispatch_failed (G4) ------------


@pytest.fixture
def read_only_redis(tmp_path):
    """A real redis-server that refuses writes with READONLY, as a replica
    does during a failover (its master unreachable)."""
    port = free_port()
    server = subprocess.Popen(
        [
            shutil.which("redis-server"),
            "--port",
            str(port),
            "--save",
            "",
            "--dir",
            str(tmp_path),
            "--replicaof",
            "127.0.0.1",
            str(free_port()),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(10)


def test_a_dispatch_refused_by_a_read_only_replica_leaves_the_run_queued(settings, read_only_redis):
    """G4: only a failure that trying again would not cure fails the run
    dispatch_failed. A replica refusing writes during a failover (READONLY),
    or Redis at maxmemory (OOM), is cured by trying again; both are
    redis ResponseErrors, which classify() maps to 'unknown'."""
    settings.REDIS_URL = read_only_redis
    agent_run = enqueue(scripted(answer()))
    refused = fresh(agent_run)
    assert (refused.status, refused.termination_reason) == ("queued", ""), (
        refused.status,
        refused.termination_reason,
        refused.error_message,
    )


# --- A legacy fence without a call can no longer be reconciled (G10) ---------


def test_a_write_in_doubt_fenced_before_pending_call_existed_can_be_reconciled(operator):
    """pending_call was added by migration 0005 without a backfill: a run
    left in doubt before it has pending_effect='non_idempotent_write' and
    pending_call NULL. Before this change it could be reconciled (and then
    requeued); now reconcile's new guard filters
    pending_call__idempotency_key='' , which never matches a NULL column:
    it answers 'changed' for ever, so the run can never be reconciled nor
    requeued, and stays listed as a write in doubt."""
    agent_run = transitions.create_queued_run({"prompt": "p"}, "p")
    AgentRun.objects.filter(pk=agent_run.pk).update(
        status="failed",
        termination_reason="write_interrupted",
        lease_token=1,
        pending_effect="non_idempotent_write",
        pending_call=None,
    )
    assert writes_in_doubt(AgentRun.objects.filter(pk=agent_run.pk)).exists()
    result = operator_actions.reconcile(fresh(agent_run), operator, "not_applied", "checked")
    assert result.ok, (result.code, result.detail)


# --- An admin action the database refuses is an error message, not a 500 ----


def test_an_admin_cancel_the_database_refuses_changes_nothing_and_says_so(operator_client):
    from runs.models.faults import step_inserts_refused

    agent_run = transitions.create_queued_run({"prompt": "p"}, "p")
    url = f"/admin/runs/agentrun/{agent_run.pk}/cancel/"
    with step_inserts_refused(kind="operator"):
        response = operator_client.post(url, {"note": "stop"}, follow=True)
    assert response.status_code == 200
    assert "nothing was changed" in response.content.decode()
    assert (fresh(agent_run).status, fresh(agent_run).cancel_requested_at) == ("queued", None)
