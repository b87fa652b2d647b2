"""The inbox's edit and answer forms refuse what they must (G22, G24):
CSRF, viewers, outsiders and other teams POSTing, a GET, a `next` that
would leave the site; a question's text and edited arguments are escaped
everywhere they are shown; bad filters are no 500."""

import pytest
from django.test import Client

from runs.models import ApprovalRequest
from runs.models.vocabulary import ApprovalStatus, RunStatus
from tests.helpers import fresh
from tests.test_admin_approvals import INBOX
from tests.test_console_people import XSS, asking, notifying

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]


def still(request):
    return ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.PENDING


def test_csrf_is_enforced_on_the_answer_and_the_edit(operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    agent_run, question = asking()
    got = client.post(
        f"{INBOX}{question.pk}/answer/", {"answer": '{"host": "db-2"}', "digest": question.digest}
    )
    assert got.status_code == 403 and still(question)
    _, approval = notifying()
    got = client.post(f"{INBOX}{approval.pk}/edit/", {"arguments": "{}", "digest": approval.digest})
    assert got.status_code == 403 and still(approval)


def test_a_viewer_and_an_outsider_post_nothing(viewer_client, outsider_client):
    agent_run, question = asking()
    _, approval = notifying()
    for client in (viewer_client, outsider_client):
        a = client.post(
            f"{INBOX}{question.pk}/answer/",
            {"answer": '{"host": "db-2"}', "digest": question.digest},
        )
        e = client.post(
            f"{INBOX}{approval.pk}/edit/",
            {"arguments": '{"recipient": "x", "message": "y"}', "digest": approval.digest},
        )
        assert a.status_code in (302, 403) and e.status_code in (302, 403), (
            a.status_code,
            e.status_code,
        )
    assert still(question) and still(approval)


def test_another_teams_member_cannot_answer_or_edit(two_teams, member):
    alpha, _ = two_teams
    client = Client()
    client.force_login(member("alfie", alpha))
    agent_run, question = asking()
    _, approval = notifying()
    a = client.post(
        f"{INBOX}{question.pk}/answer/", {"answer": '{"host": "db-2"}', "digest": question.digest}
    )
    e = client.post(
        f"{INBOX}{approval.pk}/edit/",
        {"arguments": '{"recipient": "x", "message": "y"}', "digest": approval.digest},
    )
    assert still(question) and still(approval), (a.status_code, e.status_code)
    # the GET forms say nothing of them either
    for url in (f"{INBOX}{question.pk}/answer/", f"{INBOX}{approval.pk}/edit/"):
        got = client.get(url)
        assert got.status_code in (302, 403, 404), (url, got.status_code)
        assert "Which host" not in got.content.decode()


def test_a_get_changes_nothing(operator_client):
    agent_run, question = asking()
    _, approval = notifying()
    for url in (
        f"{INBOX}{question.pk}/answer/?answer=%7B%22host%22%3A%22db-2%22%7D&digest={question.digest}",
        f"{INBOX}{approval.pk}/edit/?arguments=%7B%7D&digest={approval.digest}",
    ):
        assert operator_client.get(url).status_code == 200
    assert still(question) and still(approval)
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_INPUT


@pytest.mark.parametrize(
    "target",
    [
        "https://evil.example/",
        "//evil.example/",
        "/\\evil.example/",
        "\\\\evil.example",
        "http:/evil.example",
        "javascript:alert(1)",
        " https://evil.example",
        "https:evil.example",
    ],
)
def test_next_never_leaves_the_site(operator_client, target):
    agent_run, question = asking()
    got = operator_client.post(
        f"{INBOX}{question.pk}/answer/",
        {"answer": '{"host": "db-2"}', "digest": question.digest, "next": target},
    )
    assert got.status_code == 302
    location = got["Location"]
    assert "evil" not in location and "javascript" not in location, location
    # and as the form's hidden field / back link on a GET
    page = operator_client.get(f"{INBOX}{question.pk}/answer/", {"next": target}).content.decode()
    assert "evil.example" not in page and "javascript:alert" not in page


def test_question_and_edited_arguments_are_escaped_everywhere(operator_client, operator):
    from runs.approvals import actions

    agent_run, question = asking(
        f"Which host? {XSS}", schema={"type": "string", "description": XSS}
    )
    run2, approval = notifying()
    edited = actions.edit(
        approval,
        operator,
        digest=approval.digest,
        arguments={"recipient": XSS, "message": "</textarea>" + XSS},
        note=XSS,
    ).made
    pages = {
        "inbox": operator_client.get(INBOX),
        "answer": operator_client.get(f"{INBOX}{question.pk}/answer/"),
        "edit": operator_client.get(f"{INBOX}{edited.pk}/edit/"),
        "run": operator_client.get(f"/admin/runs/agentrun/{agent_run.pk}/change/"),
        "run2": operator_client.get(f"/admin/runs/agentrun/{run2.pk}/change/"),
    }
    for name, got in pages.items():
        body = got.content.decode()
        assert got.status_code == 200, (name, got.status_code)
        assert XSS not in body, name
        assert "</textarea><script" not in body, name
    # answered with markup: the run page shows it escaped
    got = operator_client.post(
        f"{INBOX}{question.pk}/answer/",
        {"answer": f'"{XSS.replace(chr(39), "")}"', "digest": question.digest},
    )
    body = operator_client.get(f"/admin/runs/agentrun/{agent_run.pk}/change/").content.decode()
    assert "<script>alert" not in body


@pytest.mark.parametrize(
    "query",
    ["?run=not-a-uuid", "?kind=bogus", "?run=%3Cscript%3E&kind=question", "?kind=question&page=x"],
)
def test_the_inbox_filters_refuse_garbage_without_a_500(operator_client, query):
    asking()
    got = operator_client.get(INBOX + query)
    assert got.status_code in (200, 400, 404), (query, got.status_code)
    assert "<script>" not in got.content.decode()
