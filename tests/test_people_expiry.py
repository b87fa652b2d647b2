"""G24's deadlines, as the reaper keeps them (in-process): a deferred write
in doubt is handed on again exactly once after an operator reconciles it
`not_applied`; a deferred read run again too often fails with a dead letter;
many overdue waits are all expired within a few passes; the run-ended
webhook and the gauges see each end."""

import pytest

from runs.models import ApprovalRequest, DeadLetter, RunEvent
from runs.models.selectors import is_write_in_doubt
from runs.models.vocabulary import ApprovalStatus, RunStatus, StepKind, TerminationReason
from runs.operators import actions as operator_actions
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from tests.deferred_tools import DEFERRED_TOOLS, hand_offs
from tests.drifting_model import request_for
from tests.helpers import fresh, later
from tests.test_people_edges import complete

pytestmark = [pytest.mark.django_db(transaction=True)]

OPEN_TICKET = {"name": "open_ticket", "arguments": {"title": "restart db-2"}}
LOOK_UP = {"name": "look_up_ticket", "arguments": {"title": "who owns db-2"}}
ASK = {"name": "ask_person", "arguments": {"question": "which host?"}}


@pytest.fixture
def deferred(settings):
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, *DEFERRED_TOOLS]
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "none"
    settings.NRLLM_HTTP_ALLOWED_HOSTS = ["127.0.0.1:9"]
    return settings


HOOK = {"webhook": "http://127.0.0.1:9/hooks"}


def test_in_doubt_then_reconciled_not_applied_hands_on_again_exactly_once(deferred, operator):
    plan = [{"calls": [OPEN_TICKET]}, {"answer": "done"}]
    agent_run = enqueue(request_for("scripted", plan, ["open_ticket"], **HOOK))
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_INPUT
    (first,) = hand_offs(agent_run.pk)
    report = reap_stale_runs(as_of=later(2 * 86400))
    assert "in doubt" in report.decisions[str(agent_run.pk)]
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.FAILED and is_write_in_doubt(agent_run)
    events = [e.event_type for e in RunEvent.objects.filter(run=agent_run).order_by("occurred_at")]
    assert events == ["run.waiting_for_input", "run.failed"], events
    assert DeadLetter.objects.filter(run=agent_run, reason="completion_expired").count() == 1
    # a second pass does nothing more
    assert str(agent_run.pk) not in reap_stale_runs(as_of=later(3 * 86400)).decisions

    result = operator_actions.reconcile(agent_run, operator, "not_applied", "desk never saw it")
    assert result.ok, result
    requeued = operator_actions.requeue(fresh(agent_run), operator)
    assert requeued.ok, requeued
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.WAITING_FOR_INPUT, (
        agent_run.status,
        agent_run.error_message,
    )
    assert len(hand_offs(agent_run.pk)) == 2
    pending = ApprovalRequest.objects.get(run=agent_run, status=ApprovalStatus.PENDING)
    # completing the new hand-off ends the run; no third hand-off
    second = hand_offs(agent_run.pk)[1]
    assert complete(second.message, {"result": {"ticket": "opened"}}).status_code == 200
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    assert len(hand_offs(agent_run.pk)) == 2
    assert ApprovalRequest.objects.get(pk=pending.pk).status == ApprovalStatus.ANSWERED
    # the first URL, late: it completed already / is refused, not recorded twice
    late = complete(first.message, {"result": {"ticket": "other"}})
    assert late.status_code in (200, 409), late.content
    assert agent_run.steps.filter(kind=StepKind.TOOL).count() == 1


def test_retries_exhausted_fails_with_a_dead_letter_and_an_event(deferred):
    deferred.NRLLM_MAX_REQUEUES = 1
    plan = [{"calls": [LOOK_UP]}, {"answer": "found"}]
    agent_run = enqueue(request_for("scripted", plan, ["look_up_ticket"], **HOOK))
    report = reap_stale_runs(as_of=later(2 * 86400))
    assert "runs again" in report.decisions[str(agent_run.pk)], report.decisions
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.WAITING_FOR_INPUT, agent_run.status
    assert agent_run.requeue_count == 1 and len(hand_offs(agent_run.pk)) == 2
    report = reap_stale_runs(as_of=later(4 * 86400))
    assert "too often" in report.decisions[str(agent_run.pk)], report.decisions
    agent_run = fresh(agent_run)
    assert (agent_run.status, agent_run.termination_reason) == (
        RunStatus.FAILED,
        TerminationReason.RETRIES_EXHAUSTED,
    )
    assert not is_write_in_doubt(agent_run)
    assert DeadLetter.objects.filter(run=agent_run, reason="retries_exhausted").count() == 1
    assert not ApprovalRequest.objects.filter(run=agent_run, status=ApprovalStatus.PENDING).exists()
    events = [e.event_type for e in RunEvent.objects.filter(run=agent_run).order_by("occurred_at")]
    assert events[-1] == "run.failed", events
    assert len(hand_offs(agent_run.pk)) == 2


def test_many_overdue_waits_are_all_expired_within_a_few_passes(deferred):
    plan = [{"calls": [ASK]}, {"answer": "ok"}]
    runs = [enqueue(request_for("scripted", plan, ["ask_person"])) for _ in range(7)]
    assert all(fresh(r).status == RunStatus.WAITING_FOR_INPUT for r in runs)
    first = reap_stale_runs(as_of=later(2 * 86400), batch_size=3)
    assert sum("expired unanswered" in d for d in first.decisions.values()) == 3
    reap_stale_runs(as_of=later(2 * 86400), batch_size=3)
    reap_stale_runs(as_of=later(2 * 86400), batch_size=3)
    assert all(fresh(r).status == RunStatus.COMPLETED for r in runs), [
        fresh(r).status for r in runs
    ]


def test_the_in_doubt_event_is_dead_lettered_and_the_gauges_move(deferred):
    from prometheus_client import REGISTRY, CollectorRegistry

    from runs.models.metrics import RunStateCollector

    state = CollectorRegistry()
    state.register(RunStateCollector())
    plan = [{"calls": [OPEN_TICKET]}, {"answer": "done"}]
    agent_run = enqueue(request_for("scripted", plan, ["open_ticket"], **HOOK))
    assert state.get_sample_value("nrllm_inputs_pending", {"kind": "deferred"}) == 1
    before = (
        REGISTRY.get_sample_value("nrllm_reaper_decisions_total", {"decision": "input_expired"})
        or 0
    )
    reap_stale_runs(as_of=later(2 * 86400))
    event = RunEvent.objects.get(run=agent_run, event_type="run.failed")
    assert event.termination_reason == "completion_expired"
    assert event.dead_lettered, "the failed event should say a dead letter was made"
    assert state.get_sample_value("nrllm_inputs_pending", {"kind": "deferred"}) == 0
    after = REGISTRY.get_sample_value("nrllm_reaper_decisions_total", {"decision": "input_expired"})
    assert after == before + 1
