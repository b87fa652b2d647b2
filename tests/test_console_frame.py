"""The console's frame on every page (issue #41's walk-through at 1366 px):
the approvals inbox and the failed write audits in the navigation, one
trail of breadcrumbs that never names a step twice ("Agent runs › Agent
runs" did, and "Agents › Agents"), and a 403 that is a page of the
console — its header, navigation and a way back — not Django's bare
"403 Forbidden"."""

import html
import re

import pytest
from django.contrib import admin
from django.urls import reverse

from runs.models import AgentRun
from tests.test_admin_agents import form as agent_form
from tests.test_console import audit_failed_run, safe_failed_run

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/runs/agentrun/"
APPROVALS = f"{RUNS}approvals/"
WRITE_AUDITS = f"{RUNS}write-audits/"


def breadcrumbs(content: str) -> list[str]:
    """The trail's steps as a reader sees them; one trail per page."""
    trails = re.findall(r'<ol class="breadcrumbs">(.*?)</ol>', content, re.S)
    assert len(trails) == 1, trails
    steps = re.findall(r"<li[^>]*>(.*?)</li>", trails[0], re.S)
    return [html.unescape(re.sub(r"<[^>]+>|\s+", " ", step)).strip() for step in steps]


def navigation(content: str) -> dict[str, bool]:
    """The sidebar's entries: name → whether it is marked the page shown."""
    sidebar = re.search(r'<nav class="sticky" id="nav-sidebar".*?</nav>', content, re.S)
    assert sidebar, "no navigation"
    sidebar = sidebar[0]
    entries = re.findall(
        r'<tr class="model-[^"]*?( current-model)?">.*?<a href="[^"]*"[^>]*>(.*?)</a>',
        sidebar,
        re.S,
    )
    return {html.unescape(name): bool(current) for current, name in entries}


def console_pages(client) -> list[str]:
    """Every page of the console a superuser may open, once: the index, each
    app's, each model's list, add form, one object's page and its history,
    and the operator pages."""
    pages = ["/admin/", "/admin/password_change/", f"{RUNS}start/", APPROVALS, WRITE_AUDITS]
    pages.append("/admin/django-rq/")  # without Redis: the page that says so
    for model, model_admin in admin.site._registry.items():
        opts = model._meta
        pages.append(reverse("admin:app_list", args=[opts.app_label]))
        pages.append(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
        if model_admin.has_add_permission(client.request_for_permissions):
            pages.append(reverse(f"admin:{opts.app_label}_{opts.model_name}_add"))
        first = model_admin.get_queryset(client.request_for_permissions).first()
        if first is not None:
            for view in ("change", "history"):
                pages.append(
                    reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=[first.pk])
                )
    return list(dict.fromkeys(pages))


def test_each_console_page_has_one_trail_naming_no_step_twice_and_the_operator_pages(
    admin_client, admin_user, rf
):
    safe_failed_run()
    audit_failed_run()
    assert admin_client.post("/admin/agents/agent/add/", agent_form()).status_code == 302
    request = rf.get("/admin/")
    request.user = admin_user
    admin_client.request_for_permissions = request

    pages = console_pages(admin_client)
    assert len(pages) > 40
    app_indexes = [page for page in pages if page.count("/") == 3 and page != "/admin/django-rq/"]
    without_navigation = {"/admin/password_change/", *app_indexes}
    for page in pages:
        response = admin_client.get(page)
        assert response.status_code == 200, page
        content = response.content.decode()
        if page == "/admin/":
            continue  # Django draws no trail on its index; the overview is the app list
        trail = breadcrumbs(content)
        assert len(set(trail)) == len(trail), (page, trail)
        if page in without_navigation:
            continue  # Django draws these without the sidebar: an index lists the pages itself
        entries = navigation(content)
        assert {"Approvals", "Failed write audits"} <= set(entries), page
        assert sum(entries.values()) <= 1, (page, entries)  # one entry is the page shown

    # The runs' app first in the navigation, the operator pages among its
    # lists; on the inbox, its entry alone is the page shown (not the runs
    # list, whose address starts the inbox's).
    content = admin_client.get(APPROVALS).content.decode()
    entries = navigation(content)
    assert list(entries)[:5] == [
        "Agent runs",
        "Approvals",
        "Dead letters",
        "Failed write audits",
        "Write reconciliations",
    ]
    assert [name for name, current in entries.items() if current] == ["Approvals"]
    assert breadcrumbs(admin_client.get(RUNS).content.decode()) == ["Home", "Runs", "Agent runs"]
    assert breadcrumbs(admin_client.get("/admin/agents/agent/").content.decode()) == [
        "Home",
        "Agent definitions",
        "Agents",
    ]
    # The index and the runs' app's list them too.
    for index in ("/admin/", "/admin/runs/"):
        content = admin_client.get(index).content.decode()
        assert f'href="{APPROVALS}"' in content and f'href="{WRITE_AUDITS}"' in content


def test_a_403_is_a_page_of_the_console_with_a_way_back(viewer_client, outsider_client):
    agent_run = audit_failed_run()
    run_page = f"http://testserver{RUNS}{agent_run.pk}/change/"
    refusals = [
        # A crafted reconcile without runs.reconcile_agentrun, from the run's page.
        ("post", f"{RUNS}{agent_run.pk}/reconcile/", {"outcome": "applied", "note": "x"}, run_page),
        # A list the viewer may not see (Django's admin refuses it).
        ("get", "/admin/auth/user/", {}, "https://elsewhere.example/"),
    ]
    for method, path, data, came_from in refusals:
        response = getattr(viewer_client, method)(path, data, HTTP_REFERER=came_from)
        assert response.status_code == 403, path
        content = response.content.decode()
        assert 'id="forbidden"' in content and "Nothing was changed." in content, path
        assert 'id="site-name"' in content and 'id="nav-sidebar"' in content, path
        assert breadcrumbs(content) == ["Home", "Not allowed"], path
        # Back where they came from when it is this site; the overview always.
        back = re.findall(r'<a href="([^"]*)" id="forbidden-(back|home)">', content)
        expected = [(run_page, "back")] if came_from == run_page else []
        assert back == [*expected, ("/admin/", "home")], path
    assert AgentRun.objects.get(pk=agent_run.pk).reconciliation is None
    # Not staff: Django's page, no console frame; the API keeps its shape.
    refused = outsider_client.post(f"{RUNS}{agent_run.pk}/reconcile/")
    assert refused.status_code == 302  # the admin sends them to log in
