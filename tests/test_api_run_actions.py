"""Bad input to GET/POST /api/runs/{id}/requeue/ and /restart/ gets a clear
4xx and changes nothing, never a 500; the verdicts say why; a viewer may
read a verdict but not act on it."""

import pytest

from runs.models import AgentRun
from runs.runtime import enqueue
from tests.helpers import answer, call, scripted

pytestmark = pytest.mark.django_db(transaction=True)

ACTIONS = ["requeue", "restart"]
#: A well-formed run id no run has (fixed: xdist workers collect the same tests).
UNKNOWN = "0b6f1d2e-5c3a-4f8e-9d21-7a4b3c2d1e0f"


def failed_run():
    agent_run = enqueue(
        scripted(
            call("send_notification", recipient="ops", message="hi"),
            {"error": "auth", "attempts": 1},
            answer(),
            tools=["send_notification"],
        )
    )
    agent_run.refresh_from_db()
    assert agent_run.status == "failed"
    return agent_run


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("pk", ["not-a-uuid", UNKNOWN, "%00", "x" * 300, f"{{{UNKNOWN}}}"])
def test_get_and_post_with_a_bad_id_is_404(api, action, pk):
    for method in (api.get, api.post):
        response = method(f"/api/runs/{pk}/{action}/", {}, format="json")
        assert response.status_code == 404, (method, response.status_code, response.content)


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'"note"',
        b"null",
        b'{"note": null}',
        b'{"note": "x", "extra": 1}',
        b'{"note": "\\u0000"}',
        b"{not json",
        b'{"note": "' + b"x" * 10_001 + b'"}',
    ],
)
def test_post_with_a_bad_body_is_400_and_changes_nothing(api, action, body):
    agent_run = failed_run()
    response = api.post(
        f"/api/runs/{agent_run.pk}/{action}/", body, content_type="application/json"
    )
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:300])
    assert AgentRun.objects.get(pk=agent_run.pk).status == "failed"


def test_post_with_a_note_that_is_a_number_is_refused(api):
    """A note is a string: 5 is refused, not taken for "5"."""
    agent_run = failed_run()
    response = api.post(
        f"/api/runs/{agent_run.pk}/requeue/", b'{"note": 5}', content_type="application/json"
    )
    assert response.status_code == 400, (response.status_code, response.content[:200])


@pytest.mark.parametrize("action", ACTIONS)
def test_post_with_a_lone_surrogate_in_the_note_is_not_a_500(api, action):
    """JSON allows "\\ud800"; Python decodes it to a lone surrogate that
    neither jsonb nor UTF-8 can store."""
    agent_run = enqueue(
        scripted(
            call("search_notes", query="x"), {"error": "auth"}, answer(), tools=["search_notes"]
        )
    )
    agent_run.refresh_from_db()
    assert agent_run.status == "failed"
    response = api.post(
        f"/api/runs/{agent_run.pk}/{action}/",
        b'{"note": "\\ud800"}',
        content_type="application/json",
    )
    assert response.status_code != 500, response.content[:300]
    assert 200 <= response.status_code < 500


@pytest.mark.parametrize("action", ACTIONS)
def test_get_verdict_of_a_run_with_a_broken_stored_request_is_not_a_500(api, action):
    agent_run = failed_run()
    for broken in ([], "x", {"prompt": 1}, {"prompt": "p", "tools": "abc", "provider": {}}):
        AgentRun.objects.filter(pk=agent_run.pk).update(request=broken)
        response = api.get(f"/api/runs/{agent_run.pk}/{action}/")
        assert response.status_code == 200, (broken, response.status_code, response.content[:300])
        body = response.json()
        assert body["allowed"] is False and body["code"] == "request_invalid", body
        response = api.post(f"/api/runs/{agent_run.pk}/{action}/", {}, format="json")
        assert response.status_code == 409, (broken, response.status_code, response.content[:300])


def test_the_verdicts_say_why(api):
    agent_run = failed_run()
    requeue = api.get(f"/api/runs/{agent_run.pk}/requeue/").json()
    restart = api.get(f"/api/runs/{agent_run.pk}/restart/").json()
    assert requeue["allowed"] and requeue["reason"].startswith("resumes after step 3; replays 1")
    assert not restart["allowed"] and restart["code"] == "non_idempotent_executed"
    response = api.post(f"/api/runs/{agent_run.pk}/restart/", {}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "non_idempotent_executed"


def test_viewer_may_get_the_verdict_but_not_act(viewer, api_token, operator):
    from rest_framework.test import APIClient

    agent_run = failed_run()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=api_token(viewer))
    for action in ACTIONS:
        assert client.get(f"/api/runs/{agent_run.pk}/{action}/").status_code == 200
        assert (
            client.post(f"/api/runs/{agent_run.pk}/{action}/", {}, format="json").status_code == 403
        )
        # HEAD is GET without a body: the same permission as GET.
        assert client.head(f"/api/runs/{agent_run.pk}/{action}/").status_code == 200
