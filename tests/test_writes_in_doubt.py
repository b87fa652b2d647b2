"""Writes in doubt (G3, G10, G13): an unknown outcome is a write in doubt, a
reconciliation settles the one write it was made for, and a failed write
audit is never retried, whatever happens to the settle. Tried with the
``scripted`` provider and with a model that words every answer differently,
through real rqworkers where a retry is involved."""

import pytest

from runs import transitions
from runs.models import AgentRun, DeadLetter, WriteReconciliation
from runs.models.faults import run_status_changes_refused, step_inserts_refused
from runs.models.selectors import writes_in_doubt
from runs.operators import actions as operator_actions
from runs.operators.requeue_safety import requeue_safety
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue, run
from tests.drifting_model import MODELS, NOTIFY, request_for
from tests.helpers import fresh, later, wait_until
from tools.models import Note, OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)

UNSURE_TOOLS = [
    "tests.tools_for_tests.UnsureWrite",
    "tests.tools_for_tests.UnsureIdempotentWrite",
    "tests.tools_for_tests.UnsureRead",
    "tests.tools_for_tests.SlowWrite",
    "tests.tools_for_tests.CrashingWrite",
    "tests.tools_for_tests.SlowDatabaseWrite",
    "tests.tools_for_tests.SlowDatabaseIdempotentWrite",
    "tests.tools_for_tests.ExitingWrite",
]


def one_call(model, name, arguments, **extra):
    plan = [{"calls": [{"name": name, "arguments": arguments}]}, {"answer": "Done (take {take})."}]
    return request_for("scripted" if model is None else "drifting", plan, [name], **extra)


@pytest.fixture
def unsure_tools(settings):
    settings.NRLLM_TOOLS = UNSURE_TOOLS


def in_doubt(agent_run) -> bool:
    return writes_in_doubt(AgentRun.objects.filter(pk=agent_run.pk)).exists()


# --- G13: an unknown outcome is a write in doubt ------------------------------


@pytest.mark.worker
@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_non_idempotent_write_whose_outcome_is_unknown_is_in_doubt_and_never_retried(
    model, unsure_tools, workers, operator
):
    agent_run = enqueue(one_call(model, "unsure_write", {"text": "v2 (take {take})"}))
    workers.run_burst(with_scheduler=True, NRLLM_RETRY_BACKOFF_SECONDS=1)

    stopped = fresh(agent_run)
    [attempt] = OutboxNotification.objects.all()
    assert (stopped.status, stopped.termination_reason, stopped.error_type) == (
        "failed",
        "write_interrupted",
        "WriteOutcomeUnknown",
    )
    # The call stands for the operator to reconcile; its outcome is not in
    # the journal, and the model was told nothing.
    assert stopped.pending_effect == "non_idempotent_write"
    assert stopped.pending_call["idempotency_key"] == attempt.idempotency_key
    assert not stopped.steps.filter(kind="tool").exists()
    assert DeadLetter.objects.get(run=stopped).reason == "write_interrupted"
    assert in_doubt(stopped) and requeue_safety(stopped).code == "write_in_doubt"
    assert stopped.requeue_count == 0 and stopped.lease_token == 1

    # Nothing retries it: not the reaper, not a worker.
    reap_stale_runs(as_of=later())
    workers.run_burst()
    assert OutboxNotification.objects.count() == 1 and fresh(agent_run).lease_token == 1

    # Reconciled not_applied and requeued, it runs again with the same key.
    assert operator_actions.reconcile(fresh(agent_run), operator, "not_applied", "not received").ok
    assert operator_actions.requeue(fresh(agent_run), operator, "send it").ok
    workers.run_burst()
    done = fresh(agent_run)
    assert (done.status, done.pending_effect) == ("completed", "")
    assert (
        list(OutboxNotification.objects.values_list("idempotency_key", flat=True))
        == [attempt.idempotency_key] * 2
    )
    if model is not None:
        assert model.requests_by_turn[0] == 1  # the turn that asked was replayed


@pytest.mark.worker
@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_an_idempotent_write_whose_outcome_is_unknown_is_retried_with_the_same_key(
    model, unsure_tools, workers
):
    agent_run = enqueue(one_call(model, "unsure_idempotent_write", {"slug": "v{take}"}))
    # Retried at once (no backoff): what the retry does is the subject here;
    # test_crash_recovery.py's scheduler test waits a backoff out.
    workers.start(NRLLM_RETRY_BACKOFF_SECONDS=0)
    wait_until(lambda: fresh(agent_run).is_terminal, timeout=40, what="the retry")
    done = fresh(agent_run)
    assert (done.status, done.requeue_count, done.lease_token) == ("completed", 1, 2)
    keys = list(OutboxNotification.objects.values_list("idempotency_key", flat=True))
    assert len(keys) == 2 and len(set(keys)) == 1
    if model is not None:
        assert model.requests_by_turn[0] == 1


def test_a_read_whose_outcome_is_unknown_is_an_ordinary_tool_error(unsure_tools):
    agent_run = enqueue(one_call(None, "unsure_read", {}))
    done = fresh(agent_run)
    assert done.status == "completed"
    assert "outcome unknown: the reply was cut off" in done.steps.get(kind="tool").error


@pytest.mark.parametrize("tool", ["slow_write", "crashing_write"])
def test_a_write_stopped_at_its_time_limit_or_failing_unreported_is_in_doubt(unsure_tools, tool):
    agent_run = enqueue(one_call(None, tool, {"seconds": 5}))
    stopped = fresh(agent_run)
    assert (stopped.status, stopped.termination_reason) == ("failed", "write_interrupted")
    assert stopped.pending_call["tool"] == tool and in_doubt(stopped)
    assert not stopped.steps.filter(kind="tool").exists()


@pytest.mark.parametrize(
    ("tool", "ends"),
    [
        ("slow_database_write", ("failed", "write_interrupted")),
        ("slow_database_idempotent_write", ("queued", "")),
    ],
)
def test_a_write_stopped_inside_a_database_statement_still_settles(unsure_tools, tool, ends):
    """The alarm leaves the connection mid-query; the settle goes over a new one."""
    agent_run = enqueue(one_call(None, tool, {}))
    stopped = fresh(agent_run)
    assert (stopped.status, stopped.termination_reason) == ends
    ended = run(one_call(None, tool, {}))  # interactive: run() returns, settled
    assert (ended.status, ended.termination_reason) == (
        "failed",
        "write_interrupted" if tool == "slow_database_write" else "not_retryable",
    )


def test_a_write_tool_that_exits_the_process_leaves_no_run_running(unsure_tools):
    ended = run(one_call(None, "exiting_write", {}))
    assert (ended.status, ended.termination_reason) == ("failed", "write_interrupted")
    assert in_doubt(ended)


def test_an_interactive_write_whose_outcome_is_unknown_ends_write_interrupted(unsure_tools):
    ended = run(one_call(None, "unsure_write", {"text": "x"}))
    assert (ended.status, ended.termination_reason) == ("failed", "write_interrupted")
    assert in_doubt(ended)


# --- G10: a reconciliation settles the one write it was made for -------------


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_reconciliation_settles_only_the_write_it_was_made_for(model, operator):
    # The write fails its audit; reconciled and requeued, it runs again,
    # and its audit fails again.
    with step_inserts_refused("send_notification"):
        agent_run = enqueue(
            request_for(
                "scripted" if model is None else "drifting",
                [{"calls": [NOTIFY]}, {"answer": "Done (take {take})."}],
                ["send_notification"],
            )
        )
        assert in_doubt(agent_run)
        assert operator_actions.reconcile(fresh(agent_run), operator, "not_applied", "lost").ok
        assert not in_doubt(agent_run)
        assert operator_actions.requeue(fresh(agent_run), operator, "again").ok

        again = fresh(agent_run)
        assert (again.status, again.error_type) == ("failed", "AuditPersistenceFailed")
        # A new write in doubt: listed, refused for requeue, reconcilable.
        assert in_doubt(again)
        assert requeue_safety(again).code == "write_in_doubt"
        assert operator_actions.requeue(again, operator, "again?").code == "write_in_doubt"
        assert operator_actions.reconcile(again, operator, "not_applied", "lost too").ok
    assert WriteReconciliation.objects.filter(run=agent_run).count() == 2
    assert operator_actions.requeue(fresh(agent_run), operator, "third time").ok
    assert fresh(agent_run).status == "completed"
    keys = list(OutboxNotification.objects.values_list("idempotency_key", flat=True))
    assert len(keys) == 3 and len(set(keys)) == 1  # the same call, resumed each time


# --- G3: a failed write audit is never retried --------------------------------


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_an_idempotent_write_whose_audit_and_settle_failed_is_never_requeued_by_the_reaper(
    model,
):
    upsert = {"name": "upsert_note", "arguments": {"slug": "release", "body": "v{take}"}}
    request = request_for(
        "scripted" if model is None else "drifting",
        [{"calls": [upsert]}, {"answer": "ok"}],
        ["upsert_note"],
    )
    with step_inserts_refused("upsert_note"), run_status_changes_refused():
        agent_run = enqueue(request)
    stranded = fresh(agent_run)
    assert (stranded.status, stranded.pending_effect) == ("running", "idempotent_write")
    assert stranded.pending_call[transitions.AUDIT_FAILED] is True

    # The database has recovered; the lease expires.
    reap_stale_runs(as_of=later())
    ended = fresh(agent_run)
    assert (ended.status, ended.termination_reason) == ("failed", "not_retryable")
    assert DeadLetter.objects.get(run=ended).reason == "not_retryable"
    assert ended.lease_token == 1 and Note.objects.count() == 1
