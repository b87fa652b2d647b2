"""G24's edges, each found by a review trying to break it: an edited
deferred call tells the model; a completion differing only in type is
another; the inbox's edit refuses what JSON cannot hold; approval never
applies to a question; completion URLs outlive a SECRET_KEY rotation.
In-process (no rqworkers): a run waits right after ``enqueue``; the action
that releases it runs it inline."""

import json

import pytest
from django.test import Client

from runs.approvals import actions as approval_actions
from runs.approvals import completions
from runs.models import AgentRun, ApprovalRequest
from runs.models.faults import approval_requests_refused
from runs.models.selectors import is_write_in_doubt
from runs.models.vocabulary import ApprovalStatus, RunStatus, StepKind
from runs.runtime import enqueue
from runs.runtime.run_request import InvalidRunRequest
from tests.approval_requests import pending
from tests.deferred_tools import DEFERRED_TOOLS, hand_offs
from tests.drifting_model import NOTIFY, request_for
from tests.helpers import fresh
from tests.test_admin_approvals import INBOX
from tools.approval_settings import set_approval_policy
from tools.models import ToolSetting

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]

OPEN_TICKET = {"name": "open_ticket", "arguments": {"title": "restart db-1"}}


def complete(url, body):
    data = json.dumps(body).encode()
    return Client(raise_request_exception=False).post(url, data, content_type="application/json")


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_an_edited_deferred_call_tells_the_model_it_was_edited(model, settings, operator):
    """G24: 'Approved, it executes once with the edited arguments and their
    key, and the model is told in the call's result that a person edited
    it'. A deferred tool's outcome is the completion, recorded by
    answer_call, which never adds the notice."""
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, *DEFERRED_TOOLS]
    name = "scripted" if model is None else "drifting"
    plan = [{"calls": [OPEN_TICKET]}, {"answer": "done {take}"}]
    agent_run = enqueue(request_for(name, plan, ["open_ticket"]))
    (asked,) = pending(agent_run)
    edited = approval_actions.edit(
        asked, operator, digest=asked.digest, arguments={"title": "restart db-2"}
    ).made
    assert approval_actions.approve(edited, operator, digest=edited.digest).ok
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_INPUT
    (hand_off,) = hand_offs(agent_run.pk)
    assert complete(hand_off.message, {"result": {"ticket": "closed"}}).status_code == 200
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    step = agent_run.steps.get(kind=StepKind.TOOL)
    assert step.arguments == {"title": "restart db-2"}
    assert "notice" in step.result, step.result


@pytest.mark.parametrize("first,second", [(1, True), (0, False)])
def test_a_completion_differing_only_in_type_is_another_one(settings, first, second):
    """G24: 'The same completion again is a 200 that changes nothing; a
    different one is a 409'. answers.complete compares with Python ==, so
    true == 1 and false == 0."""
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, *DEFERRED_TOOLS]
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "none"
    plan = [{"calls": [OPEN_TICKET]}, {"answer": "done"}]
    agent_run = enqueue(request_for("scripted", plan, ["open_ticket"]))
    (hand_off,) = hand_offs(agent_run.pk)
    assert complete(hand_off.message, {"result": {"restarted": first}}).status_code == 200
    other = complete(hand_off.message, {"result": {"restarted": second}})
    assert other.status_code == 409, other.content


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "1e999"])
def test_the_inbox_edit_refuses_what_json_cannot_hold(approver_client, literal):
    """The API refuses these bodies (400); the inbox's edit form parses
    them with json.loads' defaults and as_journaled turns them into the
    strings "NaN"/"Infinity": the write then runs with a value nobody typed."""
    agent_run = enqueue(
        request_for("scripted", [{"calls": [NOTIFY]}, {"answer": "sent"}], ["send_notification"])
    )
    (request,) = pending(agent_run)
    response = approver_client.post(
        f"{INBOX}{request.pk}/edit/",
        {
            "arguments": f'{{"recipient": "ops", "message": {literal}}}',
            "digest": request.digest,
            "next": INBOX,
        },
    )
    made = ApprovalRequest.objects.filter(run=agent_run, status=ApprovalStatus.PENDING).first()
    assert response.status_code == 400, made.arguments


def test_ask_person_never_waits_for_an_approval_and_asking_for_one_is_refused(operator):
    """Approval never applies to a question (G14, G24): a request listing
    ask_person in require_approval, or an operator setting it to required,
    is refused, naming why, and changes nothing."""
    plan = [{"calls": [{"name": "ask_person", "arguments": {"question": "q"}}]}, {"answer": "x"}]
    request = request_for("scripted", plan, ["ask_person"], require_approval=["ask_person"])
    with pytest.raises(InvalidRunRequest, match="never waits for an approval"):
        enqueue(request)
    assert not AgentRun.objects.exists()

    setting, _ = ToolSetting.objects.get_or_create(name="ask_person")
    refused = set_approval_policy(setting, operator, "required")
    assert (refused.ok, refused.code) == (False, "invalid"), refused
    assert ToolSetting.objects.get(name="ask_person").approval == "default"


def test_a_completion_url_survives_a_secret_key_rotation(settings):
    """Signed before SECRET_KEY was rotated (the old key in
    SECRET_KEY_FALLBACKS), a completion URL stays good; a forged one never is."""
    key = "a" * 64
    signed = completions.signature_for(key)
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "a-new-secret-key-" + "x" * 40
    assert completions.is_signed(key, signed)
    assert not completions.is_signed("b" * 64, signed)
    settings.SECRET_KEY_FALLBACKS = []
    assert not completions.is_signed(key, signed)


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_hand_off_whose_wait_cannot_be_recorded_is_a_failed_audit_in_doubt(model, settings):
    """G2, G24: the deferred write was handed on; the database refuses its
    park. The run fails, never retried, with the call on its fence — a
    write in doubt — and nothing of the wait stored."""
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, *DEFERRED_TOOLS]
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "none"
    name = "scripted" if model is None else "drifting"
    plan = [{"calls": [OPEN_TICKET]}, {"answer": "done {take}"}]
    with approval_requests_refused():
        agent_run = enqueue(request_for(name, plan, ["open_ticket"]))

    agent_run = fresh(agent_run)
    (hand_off,) = hand_offs(agent_run.pk)
    assert (agent_run.status, agent_run.error_type) == ("failed", "AuditPersistenceFailed")
    assert agent_run.pending_call["idempotency_key"] == hand_off.idempotency_key
    assert is_write_in_doubt(agent_run) and agent_run.requeue_count == 0
    assert not ApprovalRequest.objects.filter(run=agent_run).exists()
    assert not agent_run.steps.filter(kind=StepKind.INPUT).exists()
