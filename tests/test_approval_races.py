"""G14 at the edges of the runtime: what a waiting run, a decision and the
resumed attempt do when a tool is disabled, a policy tightened, a wait
cancelled or expired, a decision raced. Real PostgreSQL,
in-process dispatch (the embedded default's), faults at real boundaries."""

import threading

import pytest

from runs import transitions
from runs.approvals import actions as approval_actions
from runs.models import ApprovalRequest
from runs.models.vocabulary import ApprovalStatus, RunStatus, StepKind, TerminationReason
from runs.operators import actions as operator_actions
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from tests.drifting_model import NOTIFY, SEARCH, request_for
from tests.helpers import fresh, inserts_held, later, step_inserts_held, wait_until
from tools.models import OutboxNotification, ToolSetting

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]

TOOLS = ["search_notes", "send_notification"]
SECOND_NOTIFY = {
    "name": "send_notification",
    "arguments": {"recipient": "ops", "message": "second (take {take})"},
}


def pending(agent_run) -> list[ApprovalRequest]:
    return list(
        ApprovalRequest.objects.filter(run=agent_run, status=ApprovalStatus.PENDING).order_by(
            "position"
        )
    )


def model_name(model) -> str:
    return "scripted" if model is None else "drifting"


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_denied_call_whose_tool_was_disabled_meanwhile_is_not_a_write_in_doubt(model, operator):
    """A denied call never executes, in any attempt. If its tool is switched
    off before the run resumes, the resumed attempt still knows it never ran:
    the model is told of the denial; no write is in doubt."""
    plan = [{"calls": [NOTIFY, SEARCH]}, {"answer": "done (take {take})"}]
    agent_run = enqueue(
        request_for(model_name(model), plan, TOOLS, require_approval=["search_notes"])
    )
    notify, search = pending(agent_run)
    assert (notify.tool_name, search.tool_name) == ("send_notification", "search_notes")
    assert approval_actions.deny(notify, operator, digest=notify.digest, note="no").ok
    ToolSetting.objects.update_or_create(name="send_notification", defaults={"enabled": False})

    assert approval_actions.approve(search, operator, digest=search.digest).ok

    agent_run = fresh(agent_run)
    assert OutboxNotification.objects.count() == 0
    # The denied call is known not to have run: nothing for an operator to
    # reconcile, and the run is not dead-lettered over it.
    assert agent_run.pending_effect == "", agent_run.pending_call
    assert agent_run.status == RunStatus.COMPLETED, (
        agent_run.termination_reason,
        agent_run.error_message,
    )


def test_an_approval_given_before_a_cancel_is_not_spent_silently_after_a_requeue(operator):
    """A cancel ends the wait: its requests are withdrawn. A requeue asks
    again (a new digest, G14) — every call of the turn, not only the ones
    still pending when the run was cancelled: the approval given in the
    ended wait was for a run the operator then stopped."""
    plan = [{"calls": [NOTIFY, SECOND_NOTIFY]}, {"answer": "done"}]
    agent_run = enqueue(request_for("scripted", plan, TOOLS))
    first, second = pending(agent_run)
    assert approval_actions.approve(first, operator, digest=first.digest).ok
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert operator_actions.cancel(fresh(agent_run), operator, "stop it").ok
    assert fresh(agent_run).status == RunStatus.CANCELLED

    assert operator_actions.requeue(fresh(agent_run), operator, "go on").ok

    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.WAITING_FOR_APPROVAL
    asked = {request.position for request in pending(agent_run)}
    assert OutboxNotification.objects.count() == 0
    assert asked == {first.position, second.position}


def test_an_approval_given_before_an_expiry_is_not_spent_silently_after_a_requeue(operator):
    """The same after the reaper expired the wait: the approved call is asked again."""
    plan = [{"calls": [NOTIFY, SECOND_NOTIFY]}, {"answer": "done"}]
    agent_run = enqueue(request_for("scripted", plan, TOOLS))
    first, second = pending(agent_run)
    assert approval_actions.approve(first, operator, digest=first.digest).ok
    reap_stale_runs(as_of=later(86400 + 60))
    assert fresh(agent_run).termination_reason == TerminationReason.APPROVAL_EXPIRED

    assert operator_actions.requeue(fresh(agent_run), operator, "go on").ok

    asked = {request.position for request in pending(fresh(agent_run))}
    assert OutboxNotification.objects.count() == 0
    assert asked == {first.position, second.position}


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_an_attempt_a_cancel_stopped_between_two_approved_calls_spends_only_the_first(
    model, operator
):
    """Both calls of a turn approved; the resumed attempt sends the first,
    and the cancel requested meanwhile ends the run before the second. A
    requeue replays the first (sent once) and asks again for the second:
    its approval belonged to the attempt the operator stopped."""
    plan = [{"calls": [NOTIFY, SECOND_NOTIFY]}, {"answer": "done (take {take})"}]
    agent_run = enqueue(request_for(model_name(model), plan, TOOLS))
    first, second = pending(agent_run)
    assert approval_actions.approve(first, operator, digest=first.digest).ok
    # The first notification waits to be written; its run's row is free.
    with inserts_held(OutboxNotification, "true") as (waiting, _):
        # The last decision releases the run, which runs inline in its thread.
        decider, decided = _in_thread(
            lambda: approval_actions.approve(second, operator, digest=second.digest)
        )
        wait_until(waiting, timeout=30, what="the first write's step")
        assert transitions.cancel(agent_run.pk) is transitions.CancelOutcome.REQUESTED
    decider.join(timeout=60)
    assert "error" not in decided, decided
    assert fresh(agent_run).status == RunStatus.CANCELLED
    assert OutboxNotification.objects.count() == 1

    assert operator_actions.requeue(fresh(agent_run), operator, "go on").ok

    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.WAITING_FOR_APPROVAL, agent_run.error_message
    assert [n.idempotency_key for n in OutboxNotification.objects.all()] == [first.idempotency_key]
    (asked,) = pending(agent_run)
    assert asked.position == second.position and asked.digest != second.digest
    first.refresh_from_db()
    second.refresh_from_db()
    # The approval that was spent stays what it was; the other is withdrawn.
    assert (first.status, second.status) == (ApprovalStatus.APPROVED, ApprovalStatus.WITHDRAWN)


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_policy_tightened_while_waiting_asks_for_the_new_call_and_runs_each_once(model, operator):
    """Turn: a notification (waits by default) and an upsert (an idempotent
    write, no approval by default). While the run waits an operator requires
    approval of upsert_note: the resumed attempt parks again for it, and once
    decided runs each call once, as recorded."""
    upsert = {"name": "upsert_note", "arguments": {"slug": "rel", "body": "b (take {take})"}}
    plan = [{"calls": [NOTIFY, upsert]}, {"answer": "done (take {take})"}]
    agent_run = enqueue(request_for(model_name(model), plan, [*TOOLS, "upsert_note"]))
    (notify,) = pending(agent_run)
    ToolSetting.objects.update_or_create(name="upsert_note", defaults={"approval": "required"})

    assert approval_actions.approve(notify, operator, digest=notify.digest).ok

    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.WAITING_FOR_APPROVAL
    assert OutboxNotification.objects.count() == 0
    (note_call,) = pending(agent_run)
    assert note_call.tool_name == "upsert_note"
    assert note_call.turn_sequence == notify.turn_sequence
    assert approval_actions.approve(note_call, operator, digest=note_call.digest).ok
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    (sent,) = OutboxNotification.objects.all()
    assert sent.idempotency_key == notify.idempotency_key
    tools_run = agent_run.steps.filter(kind=StepKind.TOOL).values_list("tool_name", flat=True)
    assert sorted(tools_run) == ["send_notification", "upsert_note"]
    if model is not None:
        assert model.requests_by_turn[0] == 1


def test_a_cancel_racing_nothing_withdraws_and_a_late_decision_changes_nothing(operator):
    """Sanity: a waiting run cancelled through transitions is not released by
    the decision of a request that was pending when the operator looked."""
    agent_run = enqueue(request_for("scripted", [{"calls": [NOTIFY]}, {"answer": "x"}], TOOLS))
    (request,) = pending(agent_run)
    assert transitions.cancel(agent_run.pk) is transitions.CancelOutcome.CANCELLED
    late = approval_actions.approve(request, operator, digest=request.digest)
    assert late.ok is False
    assert fresh(agent_run).status == RunStatus.CANCELLED


def _in_thread(target, *args):
    """``target(*args)`` in a thread of its own connection; returns the
    thread and a dict that will hold its result or error."""
    from django.db import connection

    out = {}

    def body():
        try:
            out["result"] = target(*args)
        except Exception as error:  # reported to the test, not swallowed
            out["error"] = error
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread, out


def test_an_expiry_racing_the_last_decision_changes_the_run_once(operator):
    """The decision holds the run's row while its step goes in; the reaper,
    looking as if the request were long overdue, waits for it and then finds
    the run no longer waiting: the run completes, the write runs once."""
    agent_run = enqueue(request_for("scripted", [{"calls": [NOTIFY]}, {"answer": "x"}], TOOLS))
    (request,) = pending(agent_run)
    with step_inserts_held("NEW.kind = 'approval'") as (waiting, _):
        decider, decided = _in_thread(
            lambda: approval_actions.approve(request, operator, digest=request.digest)
        )
        wait_until(waiting, timeout=20, what="the decision's step")
        reaper, reaped = _in_thread(lambda: reap_stale_runs(as_of=later(86400 + 60)))
        reaper.join(timeout=2)
        assert reaper.is_alive(), "the reaper should wait for the decision's lock"
    decider.join(timeout=60)
    reaper.join(timeout=60)
    assert "error" not in decided and "error" not in reaped, (decided, reaped)
    assert decided["result"].ok
    assert reaped["result"].decisions == {}
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    assert OutboxNotification.objects.count() == 1
    request.refresh_from_db()
    assert request.status == ApprovalStatus.APPROVED


def test_a_decision_racing_a_cancel_that_holds_the_run_is_refused(operator):
    """The operator's cancel holds the run's row while its operator step goes
    in; an approval arriving meanwhile waits, then finds the run cancelled and
    its request withdrawn: nothing runs."""
    agent_run = enqueue(request_for("scripted", [{"calls": [NOTIFY]}, {"answer": "x"}], TOOLS))
    (request,) = pending(agent_run)
    with step_inserts_held("NEW.kind = 'operator'") as (waiting, _):
        canceller, cancelled = _in_thread(
            operator_actions.cancel, fresh(agent_run), operator, "stop"
        )
        wait_until(waiting, timeout=20, what="the cancel's step")
        decider, decided = _in_thread(
            lambda: approval_actions.approve(request, operator, digest=request.digest)
        )
        decider.join(timeout=2)
        assert decider.is_alive(), "the decision should wait for the cancel's lock"
    canceller.join(timeout=60)
    decider.join(timeout=60)
    assert cancelled["result"].ok, cancelled
    assert decided["result"].ok is False, decided
    assert fresh(agent_run).status == RunStatus.CANCELLED
    assert OutboxNotification.objects.count() == 0
    request.refresh_from_db()
    assert request.status == ApprovalStatus.WITHDRAWN
