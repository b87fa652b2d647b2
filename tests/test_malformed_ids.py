"""A malformed id — in an admin URL, an admin action's selection or an API
route — is a 404 (or the admin's own "does not exist" redirect), never a
500. Transactional: a database error in one request must not hide behind
the aborted transaction of an earlier one."""

from urllib.parse import quote

import pytest
from django.contrib import admin
from django.test import Client

from tests.approval_requests import unchanged, waiting
from tools.models import ToolSetting

pytestmark = pytest.mark.django_db(transaction=True)

MALFORMED = ["not-a-uuid", "%00", "x" * 300, "99999999999999999999", "a%2Fb", "'"]
#: The console's own pages for one run (``AgentRunAdmin.get_urls``).
RUN_PAGES = ["requeue/", "restart/", "cancel/", "reconcile/"]
#: The approvals inbox's (``console.approvals``), an id in the path or the query.
APPROVAL_PAGES = [
    "approvals/{}/decide/",
    "approvals/?run={}",
    "approvals/?decided_page={}",
]


def _admin_urls(bad):
    for model in admin.site._registry:
        prefix = f"/admin/{model._meta.app_label}/{model._meta.model_name}/{bad}/"
        yield from (prefix, f"{prefix}change/", f"{prefix}history/", f"{prefix}delete/")
    for page in RUN_PAGES:
        yield f"/admin/runs/agentrun/{bad}/{page}"
    for page in APPROVAL_PAGES:
        yield f"/admin/runs/agentrun/{page.format(bad)}"


@pytest.fixture
def clients(admin_client, viewer_client):
    """A superuser, who reaches every page, and a viewer, who is refused some."""
    for client in (admin_client, viewer_client):
        client.raise_request_exception = False
    return [admin_client, viewer_client]


def test_a_malformed_id_in_any_admin_url_is_a_404_or_does_not_exist_never_a_500(clients):
    """Every redirect is followed, but the admin's "does not exist" one (to
    its index, which shows the message naming the id): the index is shown
    once per client and value, with the messages of all its redirects. (It
    is the console's heaviest page, and was 700 of the 2,100 requests.)"""
    index = "/admin/"
    server_errors = []
    for bad in MALFORMED:
        for client in clients:
            for url in _admin_urls(bad):
                for method in ("get", "post"):
                    response = getattr(client, method)(url)
                    while (
                        response.status_code in (301, 302, 303, 307, 308) and response.url != index
                    ):
                        response = client.get(response.url)
                    if response.status_code >= 500:
                        server_errors.append((method, url, response.status_code))
            if (shown := client.get(index)).status_code >= 500:
                server_errors.append(("get", f"{index} showing {bad!r}", shown.status_code))
    assert server_errors == []


def test_a_malformed_run_id_is_the_admins_does_not_exist_redirect(admin_client):
    response = admin_client.get("/admin/runs/agentrun/not-a-uuid/change/", follow=True)
    assert response.redirect_chain == [("/admin/", 302)]
    assert "doesn’t exist" in response.content.decode()
    assert admin_client.get("/admin/tools/toolsetting/%00/change/").status_code == 404


@pytest.mark.parametrize(
    ("changelist", "action"),
    [
        ("/admin/runs/agentrun/", "requeue_selected"),
        ("/admin/runs/agentrun/", "restart_selected"),
        ("/admin/runs/agentrun/", "cancel_selected"),
        ("/admin/runs/deadletter/", "requeue_selected"),
        ("/admin/runs/deadletter/", "dismiss_selected"),
    ],
)
def test_a_malformed_selected_id_in_an_admin_action_is_a_400(clients, changelist, action):
    for bad in ["not-a-uuid", "\x00", "x" * 300]:
        response = clients[0].post(changelist, {"action": action, "_selected_action": [bad]})
        assert response.status_code == 400, (bad, response.status_code)


def test_a_user_bulk_delete_with_a_malformed_selected_id_is_a_400_naming_it_and_deletes_nothing(
    admin_client, operator
):
    """Django's own UserAdmin took ``abc`` to the database (a 500)."""
    changelist = "/admin/auth/user/"
    for confirmed in ({}, {"post": "yes"}):  # the action, and its confirmation page's POST
        response = admin_client.post(
            changelist,
            {"action": "delete_selected", "_selected_action": [operator.pk, "abc"], **confirmed},
        )
        assert response.status_code == 400
        page = response.content.decode()
        assert "Nothing was done: <code>abc</code> is not a user id." in page
        assert 'href="/admin/auth/user/"' in page  # back to the list, nothing lost
        assert type(operator).objects.filter(pk=operator.pk).exists()
    response = admin_client.post(
        changelist, {"action": "delete_selected", "_selected_action": [operator.pk], "post": "yes"}
    )
    assert response.status_code == 302 and not type(operator).objects.filter(pk=operator.pk)


def _malformed_for(model, value) -> bool:
    from django.core.exceptions import ValidationError

    try:
        model._meta.pk.to_python(value)
    except ValidationError:
        return True
    return False


def test_every_admin_action_refuses_a_malformed_selected_id_with_a_400(admin_client, rf):
    """Every model admin on the site, ours and those Django and knox register."""
    from django.contrib.auth import get_user_model

    request = rf.get("/admin/")
    request.user = get_user_model().objects.get(username="admin")
    answers = {}
    for model, model_admin in admin.site._registry.items():
        changelist = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        for action in model_admin.get_actions(request):
            for bad in ["abc", "x" * 300, "1.5", "'"]:
                response = admin_client.post(
                    changelist, {"action": action, "_selected_action": [bad]}
                )
                expected = 400 if _malformed_for(model, bad) else response.status_code
                if response.status_code != expected or expected >= 500:
                    answers[(model._meta.label, action, bad)] = response.status_code
    assert answers == {}


def test_a_malformed_id_in_any_api_route_is_a_404(api):
    api.raise_request_exception = False
    routes = [
        ("get", "/api/runs/{}/"),
        ("get", "/api/runs/{}/steps/"),
        ("post", "/api/runs/{}/cancel/"),
        *[
            (method, f"/api/runs/{{}}/{action}/")
            for action in ("requeue", "restart")
            for method in ("get", "post")
        ],
        ("post", "/api/write-audits/{}/reconcile/"),
        ("get", "/api/tools/{}/"),
        ("patch", "/api/tools/{}/"),
        ("get", "/api/approvals/{}/"),
        ("post", "/api/approvals/{}/approve/"),
        ("post", "/api/approvals/{}/deny/"),
    ]
    for bad in MALFORMED:
        for method, route in routes:
            response = getattr(api, method)(route.format(bad), {"enabled": False}, format="json")
            assert response.status_code == 404, (method, route, bad, response.status_code)
            assert response["Content-Type"] == "application/json", (method, route, bad)
            assert response.json()["code"] == "not_found", (method, route, bad)
            # It names the id, or the path no route matches (a%2Fb) — never
            # the resolver's list of every route it tried.
            assert "URLPattern" not in response.json()["detail"], (method, route, bad)


def test_an_api_url_no_route_matches_is_a_404_naming_the_path(api):
    for path in ["/api/approvals/a%2Fb/", "/api/approvals/7/approve/extra/", "/api/nothing/"]:
        response = api.get(path)
        assert response.status_code == 404
        assert response.json() == {
            "code": "not_found",
            "detail": f"no such endpoint: {path.replace('%2F', '/')}",
        }


@pytest.mark.usefixtures("approvals")
def test_a_malformed_or_unknown_approval_id_decides_nothing_in_the_api_or_the_admin(api, approver):
    agent_run, request = waiting()
    inbox = Client(raise_request_exception=False)
    inbox.force_login(approver)
    for bad in [*MALFORMED, "-1", "1.5", " 7", "\uff17", "9223372036854775808"]:
        for action in ("approve", "deny"):
            response = api.post(
                f"/api/approvals/{quote(bad)}/{action}/", {"digest": request.digest}, format="json"
            )
            assert response.status_code == 404, (bad, action, response.status_code)
        response = inbox.post(
            f"/admin/runs/agentrun/approvals/{quote(bad)}/decide/",
            {"decision": "approve", "digest": request.digest},
            follow=True,
        )
        assert response.status_code < 500, (bad, response.status_code)
    unchanged(agent_run, request)
    response = api.get(f"/api/approvals/?run={quote('not-a-uuid')}")
    assert response.status_code == 400 and response.json()["errors"] == {
        "run": ["Enter a valid UUID."]
    }
    assert inbox.get("/admin/runs/agentrun/approvals/?run=not-a-uuid").status_code == 400
    unknown = inbox.post(
        "/admin/runs/agentrun/approvals/99999999999999999999/decide/",
        {"decision": "approve", "digest": request.digest},
        follow=True,
    )
    assert "There is no such approval request." in unknown.content.decode()
    unchanged(agent_run, request)


def test_a_nul_in_a_query_string_is_a_400(clients, api):
    for url in ["/admin/runs/agentrun/?status=%00", "/admin/runs/agentrun/?tool=%00"]:
        assert clients[0].get(url).status_code == 400, url
    response = api.get("/api/runs/?tool=%00")
    assert response.status_code == 400 and response.json()["code"] == "invalid"


def test_a_nul_in_a_posted_form_is_a_400_and_changes_nothing(clients):
    """The tool settings' inline edit looks each row up by its posted
    ``name``: a NUL there reached PostgreSQL (a 500)."""
    ToolSetting.objects.update_or_create(name="post_webhook", defaults={"enabled": False})
    inline_edit = {
        "form-TOTAL_FORMS": "1",
        "form-INITIAL_FORMS": "1",
        "form-MIN_NUM_FORMS": "0",
        "form-MAX_NUM_FORMS": "1000",
        "form-0-name": "post\x00webhook",
        "form-0-enabled": "on",
        "_save": "Save",
    }
    changelist = "/admin/tools/toolsetting/"
    assert clients[0].post(changelist, inline_edit).status_code == 400
    assert (
        clients[0]
        .post(changelist, {**inline_edit, "form-0-name": "post_webhook", "x\x00": "1"})
        .status_code
        == 400
    )
    assert ToolSetting.objects.get(name="post_webhook").enabled is False


def test_a_nul_in_a_json_body_is_left_to_the_api_which_names_the_field(api):
    response = api.post(
        "/api/runs/",
        {"prompt": "a\x00b", "tools": [], "provider": {"kind": "scripted", "turns": []}},
        format="json",
    )
    assert response.status_code == 400 and "errors" in response.json()


@pytest.mark.parametrize(
    "header",
    [
        {"HTTP_AUTHORIZATION": "Token abc\x00def"},
        {"HTTP_IDEMPOTENCY_KEY": "a\x00b"},
        {"HTTP_X_FORWARDED_FOR": "10.0.0.1\x00"},
    ],
)
def test_a_nul_in_a_header_is_a_400_the_api_token_included(db, header):
    """knox looks a token up by its prefix: a NUL in it was a database error,
    answered 503 as if the database were away."""
    client = Client(raise_request_exception=False)
    response = client.get("/api/runs/", **header)
    assert response.status_code == 400, response.status_code
    assert response.json()["code"] == "invalid"
    assert client.get("/admin/", **header).status_code == 400
