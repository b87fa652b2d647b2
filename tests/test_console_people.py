"""G24 in the console's inbox: an approver edits a waiting call (a new
call, waiting for its own approval — under four-eyes another approver's,
and the editor is told why not theirs), a runner answers the agent's
question, a deferred call is shown with nothing to do; every refusal of
the input — malformed JSON, an argument or an answer its schema refuses —
shows the form again with the error naming the field and stores nothing.
A viewer sees it all and gets no form; the question, a model's text, is
escaped. In-process runs (a run waits right after ``enqueue``; the action
that releases it runs it to its end inline), the Django test client, real
PostgreSQL. The inbox's decisions are ``test_admin_approvals.py``'s."""

import html
import json
import re

import pytest

from runs.approvals import actions
from runs.models import ApprovalRequest, RunStep
from runs.models.vocabulary import ApprovalStatus, RunStatus, StepKind, WaitKind
from runs.runtime import enqueue
from tests.approval_requests import pending
from tests.deferred_tools import DEFERRED_TOOLS
from tests.drifting_model import NOTIFY, request_for
from tests.helpers import fresh
from tests.test_admin_approvals import INBOX, RUNS, decide, messages_on
from tools.models import OutboxNotification

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]

TOOLS = ["search_notes", "send_notification"]
EDITED = {"recipient": "ops", "message": "restarting db-2, not db-1"}
HOST_SCHEMA = {
    "type": "object",
    "properties": {"host": {"type": "string", "pattern": "^db-[0-9]+$"}},
    "required": ["host"],
    "additionalProperties": False,
}
XSS = "<script>alert('x')</script>"


def notifying():
    """A run that waits for the approval of one notification, and its request."""
    agent_run = enqueue(request_for("scripted", [{"calls": [NOTIFY]}, {"answer": "sent"}], TOOLS))
    (request,) = pending(agent_run)
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    return fresh(agent_run), request


def asking(question="Which host is broken?", schema=HOST_SCHEMA):
    """A run that waits for the answer to its question, and the question."""
    arguments = {"question": question}
    if schema is not None:
        arguments["answer_schema"] = schema
    plan = [{"calls": [{"name": "ask_person", "arguments": arguments}]}, {"answer": "restarted"}]
    agent_run = enqueue(request_for("scripted", plan, ["ask_person"]))
    (asked,) = pending(agent_run)
    assert (fresh(agent_run).status, asked.kind) == (RunStatus.WAITING_FOR_INPUT, "question")
    return fresh(agent_run), asked


def the_call(page: str, request) -> str:
    """The inbox's block of one call (up to the next call or the section's end)."""
    start = page.index(f'id="approval-{request.pk}"')
    ends = [page.find(mark, start + 1) for mark in ('class="approval-call', 'id="deferred-calls"')]
    ends = [end for end in ends if end != -1]
    return page[start : min(ends) if ends else len(page)]


def edit(client, request, text, *, digest=None, note="", follow=True):
    return client.post(
        f"{INBOX}{request.pk}/edit/",
        {"arguments": text, "digest": digest or request.digest, "note": note, "next": INBOX},
        follow=follow,
    )


def answer(client, question, text, *, note="", follow=True):
    return client.post(
        f"{INBOX}{question.pk}/answer/",
        {"answer": text, "digest": question.digest, "note": note, "next": INBOX},
        follow=follow,
    )


def nothing_changed(agent_run, status, request) -> None:
    now = fresh(agent_run)
    assert (now.status, now.step_count) == (status, agent_run.step_count)
    assert pending(agent_run) == [request]
    assert ApprovalRequest.objects.filter(run=agent_run).count() == 1


def test_an_edit_in_the_inbox_waits_for_a_second_approver_and_runs_with_its_arguments(
    settings, approver_client, operator_client
):
    settings.NRLLM_APPROVAL_SECOND_PERSON = True
    agent_run, original = notifying()
    page = approver_client.get(INBOX).content.decode()
    block = the_call(page, original)
    # Edit leads to the form, prefilled with the call's arguments as pretty JSON.
    assert f'href="{INBOX}{original.pk}/edit/?next=' in block
    standalone = approver_client.get(f"{INBOX}{original.pk}/edit/").content.decode()
    assert f'action="{INBOX}{original.pk}/edit/"' in standalone
    assert html.escape(json.dumps(original.arguments, indent=2)) in standalone
    assert "The tool's parameters (JSON Schema)" in standalone

    response = edit(approver_client, original, json.dumps(EDITED), note="db-2 is the broken one")

    assert response.redirect_chain[-1][0].startswith(INBOX)
    (message,) = messages_on(response)
    assert "edited; the edited call waits for another approver to approve it" in message
    (new,) = pending(agent_run)
    assert (new.arguments, new.replaces_id, new.edited_by.username) == (EDITED, original.pk, "ada")
    assert ApprovalRequest.objects.get(pk=original.pk).status == ApprovalStatus.REPLACED
    mine = html.unescape(the_call(response.content.decode(), new))
    assert 'Edited by <strong class="editor">ada<' in mine and "it replaces request" in mine
    assert "team" in mine and "ops" in mine  # the recipient, before and after
    # Four-eyes: the editor is told why they may not approve, and may not.
    assert "approve-button" not in mine and "deny-button" in mine
    assert "you edited this call: another approver must approve your edit" in mine
    crafted = decide(approver_client, new, "approve")
    assert any("you edited this call" in text for text in messages_on(crafted))
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL

    theirs = the_call(operator_client.get(INBOX).content.decode(), new)
    assert "approve-button" in theirs and "Edited by <strong" in theirs
    approved = decide(operator_client, new, "approve", note="right host")

    assert any("approved" in text for text in messages_on(approved))
    assert fresh(agent_run).status == RunStatus.COMPLETED
    (notification,) = OutboxNotification.objects.all()
    assert (notification.recipient, notification.idempotency_key) == ("ops", new.idempotency_key)
    ran = RunStep.objects.get(run=agent_run, kind=StepKind.TOOL, tool_name="send_notification")
    assert ran.arguments == EDITED
    decided = re.search(rf'id="decided-{original.pk}">(.*?)</tr>', approved.content.decode(), re.S)
    assert "replaced" in decided.group(1) and "db-2 is the broken one" in decided.group(1)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            '{"recipient": "ops", "message": ',
            "arguments: not valid JSON — Expecting value at line 1",
        ),
        ('{"recipient": 5, "message": "x"}', "recipient"),
        ('{"recipient": "ops"}', "message"),
        ('["ops"]', "must be a JSON object"),
        (json.dumps(NOTIFY["arguments"]), "nothing to edit"),
    ],
    ids=["malformed", "wrong-type", "missing", "not-an-object", "unchanged"],
)
def test_an_edit_its_json_or_its_schema_refuses_shows_the_form_again_and_changes_nothing(
    approver_client, text, said
):
    agent_run, request = notifying()
    # The call as the model asked for it, arguments as its plan gave them.
    if "nothing to edit" in said:
        text = json.dumps(request.arguments)

    response = edit(approver_client, request, text, follow=False)

    assert response.status_code == 400
    page = html.unescape(response.content.decode())
    (errors,) = re.findall(
        r'<ul class="errorlist" id="arguments-errors-\d+">(.*?)</ul>', page, re.S
    )
    assert said in errors, errors
    assert text in page  # what was typed, to fix
    assert 'class="edit-form"' in page
    nothing_changed(agent_run, RunStatus.WAITING_FOR_APPROVAL, request)


def test_a_question_answered_in_the_inbox_completes_the_run(approver_client):
    agent_run, question = asking()
    page = approver_client.get(INBOX).content.decode()
    block = the_call(page, question)
    assert "Which host is broken?" in block
    assert html.escape(json.dumps(HOST_SCHEMA, indent=2, sort_keys=True)) in block
    assert 'class="answer-format">JSON</strong>' in block
    assert f'action="{INBOX}{question.pk}/answer/"' in block
    assert "The agent asks a person a question" in page
    # The run's page says what it waits for, and links to the inbox.
    run_page = approver_client.get(f"{RUNS}{agent_run.pk}/change/").content.decode()
    assert 'id="waits-for-input"' in run_page and "Which host is broken?" in run_page
    assert f'href="{INBOX}?run={agent_run.pk}#approval-{question.pk}"' in run_page
    assert 'class="run-status status-waiting_for_input"' in run_page

    response = answer(approver_client, question, '{"host": "db-2"}', note="checked the graphs")

    (message,) = messages_on(response)
    assert "answered; the run goes back to the queue" in message
    assert "Since then it made 1 model call, and completed." in message
    assert fresh(agent_run).status == RunStatus.COMPLETED
    told = RunStep.objects.get(run=agent_run, kind=StepKind.TOOL)
    assert told.result == {"answer": {"host": "db-2"}, "answered_by": "ada"}
    question.refresh_from_db()
    assert (question.status, question.answer, question.note) == (
        ApprovalStatus.ANSWERED,
        {"host": "db-2"},
        "checked the graphs",
    )
    decided = re.search(rf'id="decided-{question.pk}">(.*?)</tr>', response.content.decode(), re.S)
    assert "answered" in decided.group(1) and "db-2" in decided.group(1)
    # The run's page tells the story since the answer.
    done = html.unescape(approver_client.get(f"{RUNS}{agent_run.pk}/change/").content.decode())
    assert "Since your answer of call 1 of turn 1 (ask_person)" in done
    assert "ask_person (call 1 of turn 1) answered by ada: checked the graphs" in done


def test_a_question_without_a_schema_takes_plain_text(approver_client):
    agent_run, question = asking("What is the maintenance window?", schema=None)
    block = the_call(approver_client.get(INBOX).content.decode(), question)
    assert 'class="answer-format">plain text</strong>' in block

    answer(approver_client, question, "Sunday 02:00-04:00 UTC\n")

    told = RunStep.objects.get(run=agent_run, kind=StepKind.TOOL)
    assert told.result["answer"] == "Sunday 02:00-04:00 UTC"
    assert fresh(agent_run).status == RunStatus.COMPLETED


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"hostname": "db-2"}', "answer: 'host' is a required property"),
        ('{"host": "the second one"}', "answer.host"),
        ('{"host": ', "answer: not valid JSON — Expecting value at line 1"),
    ],
    ids=["missing", "pattern", "malformed"],
)
def test_an_answer_its_schema_refuses_shows_the_form_again_and_stores_nothing(
    approver_client, text, said
):
    agent_run, question = asking()

    response = answer(approver_client, question, text, follow=False)

    assert response.status_code == 400
    page = html.unescape(response.content.decode())
    (errors,) = re.findall(r'id="answer-errors-\d+">(.*?)</ul>', page, re.S)
    assert said in errors, errors
    assert text in page and "Which host is broken?" in page
    nothing_changed(agent_run, RunStatus.WAITING_FOR_INPUT, question)
    question.refresh_from_db()
    assert question.answer is None and question.status == ApprovalStatus.PENDING


def test_a_viewer_sees_questions_and_edits_but_has_no_forms(viewer_client, approver, settings):
    _, question = asking()
    agent_run, original = notifying()
    new = actions.edit(original, approver, digest=original.digest, arguments=EDITED).made
    agent_run = fresh(agent_run)

    page = html.unescape(viewer_client.get(INBOX).content.decode())

    assert "Which host is broken?" in page and 'class="editor">ada<' in page
    for form in ("answer-form", "edit-link", "decide-form"):
        assert not re.search(rf'class="[^"]*\b{form}\b', page), form
    assert "You may look but not answer: you are not a runner in team 'default'" in page
    assert "You may look but not decide" in page
    assert answer(viewer_client, question, '{"host": "db-2"}', follow=False).status_code == 403
    assert edit(viewer_client, new, json.dumps(NOTIFY["arguments"]), follow=False).status_code == (
        403
    )
    assert viewer_client.get(f"{INBOX}{question.pk}/answer/").status_code == 403
    assert fresh(agent_run).step_count == agent_run.step_count
    assert pending(agent_run) == [new] and pending(question.run_id) == [question]


def test_the_question_a_model_wrote_is_escaped(approver_client):
    asking(f"Which host? {XSS}", schema={"type": "string", "description": XSS})

    for url in (INBOX, f"{INBOX}?kind=question"):
        page = approver_client.get(url).content.decode()
        assert XSS not in page
        assert html.escape(XSS) in page
    question = ApprovalRequest.objects.get(kind=WaitKind.QUESTION)
    standalone = approver_client.get(f"{INBOX}{question.pk}/answer/").content.decode()
    assert XSS not in standalone and html.escape(XSS) in standalone


def test_a_deferred_call_is_listed_with_its_reference_and_no_action(settings, approver_client):
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, *DEFERRED_TOOLS]
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "none"
    plan = [{"calls": [{"name": "open_ticket", "arguments": {"title": "restart db-2"}}]}]
    agent_run = enqueue(request_for("scripted", [*plan, {"answer": "done"}], ["open_ticket"]))
    (deferred,) = pending(agent_run)
    _, question = asking()

    page = approver_client.get(INBOX).content.decode()

    row = re.search(rf'id="approval-{deferred.pk}">(.*?)</tr>', page, re.S).group(1)
    assert "open_ticket" in row and deferred.reference in row and "restart db-2" in row
    assert "<form" not in row
    assert "Waiting for another system (1)" in page
    # The kind filter: each kind's count; one kind shows only its own.
    assert re.search(r'class="kind-deferred"[^>]*>deferred calls \(1\)</a>', page)
    assert re.search(r'class="kind-question"[^>]*>questions \(1\)</a>', page)
    only = approver_client.get(f"{INBOX}?kind=deferred").content.decode()
    assert f'id="approval-{deferred.pk}"' in only and f'id="approval-{question.pk}"' not in only
    questions = approver_client.get(f"{INBOX}?kind=question").content.decode()
    assert f'id="approval-{question.pk}"' in questions and 'id="deferred-calls"' not in questions
    assert approver_client.get(f"{INBOX}?kind=nonsense").status_code == 400
    # The run page says what it waits for; the list and the overview count it.
    run_page = approver_client.get(f"{RUNS}{agent_run.pk}/change/").content.decode()
    assert "This run waits for another system" in run_page and deferred.reference in run_page
    overview = approver_client.get("/admin/").content.decode()
    assert re.search(r'id="pending-deferred">1<', overview)
    assert re.search(r'id="pending-questions">1<', overview)
    assert re.search(r'id="runs-waiting-for-input">2 runs waiting for input<', overview)
    assert re.search(r'id="header-questions"[^>]*>1 question<', overview)
