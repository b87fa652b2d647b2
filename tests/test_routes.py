"""Every route of the URL configuration answers a client with no
credentials as its part of the site does — the console sends it to log in,
the API answers 401 in its shape — and never with a 5xx or a page of
content. The few with a rule of their own (the front page, which leads to
the console; the API's entry, schema and docs, which need no credentials;
a trigger's hook, whose credential is the event's signature; a deferred
call's completion URL, whose credential is its signature; the probes
and metrics) are named here: a route added elsewhere is held to
its part's rule until it is."""

import re

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

pytestmark = pytest.mark.django_db(transaction=True)

#: A sample for each path converter: well formed, naming no object.
SAMPLES = {
    "int": "1",
    "uuid": "0b6f1d2e-5c3a-4f8e-9d21-7a4b3c2d1e0f",
    "str": "x",
    "path": "1",
}
#: The routes that answer a client with no credentials by a rule of their
#: own: status, and where it is sent.
OWN_RULE = {
    "/": (302, "/admin/"),
    "/healthz": (200, None),
    "/readyz": (200, None),
    # A bearer NRLLM_METRICS_TOKEN or a staff session.
    "/metrics": (401, None),
    "/admin/login/": (200, None),
    "/admin/logout/": (302, "/admin/"),
    # The API's entry, its schema and docs: how a client finds its way in.
    "/api/": (200, None),
    "/api/schema/": (200, None),
    "/api/docs/": (200, None),
    # A trigger's hook: no credentials but the event's signature, POST only.
    "/api/hooks/x/": (405, None),
    # A deferred call's completion: no credentials but the URL's signature, POST only.
    "/api/completions/x/x/": (405, None),
}


def routes(patterns=None, prefix=""):
    """Every route, as a path with each parameter filled with a sample."""
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(pattern, URLResolver):
            yield from routes(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield "/" + concrete(prefix + str(pattern.pattern))


def concrete(route: str) -> str:
    """``route`` with each ``<converter:name>`` a sample and each regex
    group its first alternative (the admin's ``app_label``), or "x"."""
    route = re.sub(r"<(?:(\w+):)?\w+>", lambda match: SAMPLES[match[1] or "str"], route)
    route = re.sub(
        r"\(\?P<\w+>([^)]*)\)",
        lambda match: first if re.fullmatch(r"\w+", first := match[1].split("|")[0]) else "x",
        route,
    )
    return route.replace("^", "").replace("$", "")


def test_every_route_answers_an_anonymous_client_as_its_part_of_the_site_does():
    client = Client(raise_request_exception=False)
    paths = sorted(set(routes()))
    assert {"/", "/api/", "/api/runs/x/rerun-from/1/", "/admin/runs/agentrun/"} <= set(paths)
    assert len(paths) > 150

    wrong = {}
    for path in paths:
        response = client.get(path)
        location = response.get("Location", "")
        if path in OWN_RULE:
            expected = OWN_RULE[path]
            got = (response.status_code, location or None)
        elif path.startswith("/api/"):
            expected = (401, "not_authenticated")
            got = (response.status_code, response.json().get("code"))
        elif path == "/admin/x":
            # The admin's catch-all: no page there (it would add a slash).
            expected, got = (404, None), (response.status_code, None)
        else:
            # Every page of the console (the queue dashboard's included).
            expected = (302, "/admin/login/")
            got = (response.status_code, location.partition("?")[0])
        if got != expected:
            wrong[path] = got
    assert wrong == {}
