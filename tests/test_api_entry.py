"""Where an integrator starts (#47): ``/`` leads to the console, ``/api/``
lists the API's resources and links its schema and docs, the console links
the docs; a ``Bearer`` header is told the scheme is ``Token``."""

import pytest
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

from api.views.root import RESOURCES

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_front_page_is_the_console_and_the_api_root_lists_its_resources(
    operator, operator_client, api_token
):
    front = APIClient().get("/")
    assert (front.status_code, front["Location"]) == (302, "/admin/")

    root = APIClient().get("/api/")  # no credentials: it says how to get them
    assert root.status_code == 200 and root["Content-Type"] == "application/json"
    listed = root.json()
    assert listed["schema"] == "http://testserver/api/schema/"
    assert listed["docs"] == "http://testserver/api/docs/"
    assert listed["authentication"].startswith("Authorization: Token <key>")
    assert "create_api_token" in listed["authentication"]
    assert set(listed["resources"]) == set(RESOURCES)
    # Each one answers there: a client that follows the links finds them.
    operator.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=api_token(operator))
    for name, url in listed["resources"].items():
        path = url.removeprefix("http://testserver")
        if name == "runs_bulk":  # a POST: an empty body is told what it lacks
            assert client.post(path, {}, format="json").status_code == 400
        else:  # a link followed answers, usage's with the grouping it needs
            assert client.get(path).status_code == 200, (name, path)
    for url in (listed["schema"], listed["docs"]):
        assert APIClient().get(url.removeprefix("http://testserver")).status_code == 200
    # In a browser, DRF's browsable page of the same, its links clickable.
    page = operator_client.get("/api/", HTTP_ACCEPT="text/html").content.decode()
    assert 'href="http://testserver/api/runs/"' in page
    assert 'href="http://testserver/api/docs/"' in page
    # The console links the docs, beside the user's links.
    console = operator_client.get("/admin/").content.decode()
    assert '<a href="/api/docs/" id="header-api-docs"' in console


def test_a_bearer_token_is_a_401_that_says_the_scheme_is_token(operator, api_token):
    key = api_token(operator).removeprefix("Token ")

    def runs_list(authorization: str | None):
        client = APIClient()
        if authorization is not None:
            client.credentials(HTTP_AUTHORIZATION=authorization)
        return client.get("/api/runs/")

    bearer = runs_list(f"Bearer {key}")
    assert (bearer.status_code, bearer.json()["code"], bearer["WWW-Authenticate"]) == (
        401,
        "not_authenticated",
        "Token",
    )
    assert bearer.json()["detail"] == (
        "the Authorization header gives the scheme 'Bearer'; this API's scheme is 'Token': "
        "use 'Authorization: Token <key>' (python manage.py create_api_token USERNAME)"
    )
    bare = runs_list(key)
    assert bare.status_code == 401
    assert "gives no scheme; this API's scheme is 'Token'" in bare.json()["detail"]
    assert runs_list(f"Token {key}").status_code == 200
    # No header at all: the usual answer, nothing about schemes.
    assert runs_list(None).json()["detail"] == "Authentication credentials were not provided."
