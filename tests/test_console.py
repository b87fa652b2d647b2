"""The operator console in the admin: pages, filters, actions, permissions,
escaping, and a runs list whose query count does not grow with its rows."""

import html
import re

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from agents.models import Agent, AgentVersion
from runs import transitions
from runs.models import AgentRun, DeadLetter
from runs.models.faults import step_inserts_refused
from runs.runtime import enqueue, run
from tests.helpers import answer, call, scripted
from tools.models import OutboxNotification, ToolSetting

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/runs/agentrun/"
XSS = "<script>alert('x')</script>"


def detail(agent_run):
    return f"{RUNS}{agent_run.pk}/change/"


def safe_failed_run():
    agent_run = enqueue(
        scripted(call("search_notes", query=XSS), {"error": "auth"}, tools=["search_notes"])
    )
    return AgentRun.objects.get(pk=agent_run.pk)


def audit_failed_run():
    with step_inserts_refused("send_notification"):
        agent_run = enqueue(
            scripted(
                call("send_notification", recipient="ops", message=XSS),
                answer(),
                tools=["send_notification"],
            )
        )
    return AgentRun.objects.get(pk=agent_run.pk)


def test_pages_need_staff_and_render_for_a_viewer(viewer_client, outsider_client):
    agent_run = safe_failed_run()
    for url in [
        RUNS,
        detail(agent_run),
        "/admin/",  # the overview
        f"{RUNS}write-audits/",
        "/admin/runs/deadletter/",
        "/admin/tools/toolsetting/",
    ]:
        page = viewer_client.get(url)
        assert page.status_code == 200, url
        assert outsider_client.get(url).status_code == 302, url  # to the login page
        # Branded; no "View site" (the app has none: it was a 404); the
        # breadcrumbs in the markup Django 6 styles (none on the home page,
        # as Django draws it).
        content = page.content.decode()
        assert "<title>" in content and "nrllm-ops console" in content, url
        assert '<div id="site-name"><a href="/admin/">nrllm-ops</a></div>' in content, url
        assert "View site" not in content, url
        assert ('<ol class="breadcrumbs">' in content) == (url != "/admin/"), url


def test_model_and_tool_text_is_escaped_everywhere(operator_client):
    safe_failed_run()
    audited = audit_failed_run()
    pages = [RUNS, detail(audited), f"{RUNS}write-audits/", detail(AgentRun.objects.last())]
    for url in pages:
        content = operator_client.get(url).content.decode()
        assert XSS not in content, url
    assert "&lt;script&gt;" in operator_client.get(f"{RUNS}write-audits/").content.decode()


def test_long_values_are_cut_with_a_way_to_see_them_whole(operator_client):
    long_query = "x" * 500
    agent_run = run(
        scripted(call("search_notes", query=long_query), answer(), tools=["search_notes"])
    )
    content = operator_client.get(detail(agent_run)).content.decode()
    assert "<details>" in content and long_query in content


def test_the_detail_page_shows_the_timeline_and_the_verdict(operator_client):
    agent_run = safe_failed_run()
    content = operator_client.get(detail(agent_run)).content.decode()
    assert "resumes after step 3" in content and 'id="requeue-button"' in content
    assert "safe to restart" in content and 'id="restart-button"' in content
    assert "Steps (3)" in content  # request, llm, tool; then the provider failed
    unsafe = audit_failed_run()
    content = operator_client.get(detail(unsafe)).content.decode()
    assert "may have landed; reconcile it first" in content
    assert 'id="requeue-button"' not in content and 'name="outcome"' in content


def test_a_viewer_sees_no_buttons_and_gets_403_for_crafted_posts(viewer_client):
    agent_run = safe_failed_run()
    content = viewer_client.get(detail(agent_run)).content.decode()
    assert 'id="requeue-button"' not in content and 'name="outcome"' not in content
    listing = viewer_client.get(RUNS).content.decode()
    assert "requeue_selected" not in listing and "cancel_selected" not in listing
    for path in ["requeue", "cancel", "reconcile"]:
        response = viewer_client.post(f"{RUNS}{agent_run.pk}/{path}/", {"note": "x"})
        assert response.status_code == 403, path
    for action in ["requeue_selected", "cancel_selected"]:
        response = viewer_client.post(RUNS, {"action": action, "_selected_action": [agent_run.pk]})
        assert response.status_code == 403, action
    dead_letter = DeadLetter.objects.get(run=agent_run)
    response = viewer_client.post(
        "/admin/runs/deadletter/",
        {
            "action": "dismiss_selected",
            "_selected_action": [dead_letter.pk],
            "confirm": "yes",
            "note": "x",
        },
    )
    assert response.status_code == 403
    assert AgentRun.objects.get(pk=agent_run.pk).status == "failed"
    assert DeadLetter.objects.get(pk=dead_letter.pk).resolved_at is None


def test_requeue_from_the_detail_page(operator_client):
    agent_run = safe_failed_run()
    # An auth failure comes again unless fixed: the page asks first.
    form = {"note": "auth fixed", "confirm": "yes"}
    response = operator_client.post(f"{RUNS}{agent_run.pk}/requeue/", form)
    assert response.status_code == 302
    operator_step = AgentRun.objects.get(pk=agent_run.pk).steps.get(kind="operator")
    assert operator_step.result["note"] == "auth fixed"


def test_the_requeue_action_confirms_and_leaves_unsafe_runs_out(operator_client):
    safe, unsafe = safe_failed_run(), audit_failed_run()
    selected = {"action": "requeue_selected", "_selected_action": [safe.pk, unsafe.pk]}
    page = operator_client.post(RUNS, selected).content.decode()
    assert "will be requeued" in page and "refused (write_in_doubt):" in page
    assert "may have landed; reconcile it first" in page
    assert "search_notes</code> (read_only)" in page
    operator_client.post(RUNS, {**selected, "confirm": "yes", "note": "batch"})
    assert AgentRun.objects.get(pk=safe.pk).steps.filter(kind="operator").count() == 1
    assert AgentRun.objects.get(pk=unsafe.pk).steps.filter(kind="operator").count() == 0
    assert AgentRun.objects.get(pk=unsafe.pk).status == "failed"


def test_reconcile_from_the_write_audits_page_then_requeue(operator_client):
    agent_run = audit_failed_run()
    page = operator_client.get(f"{RUNS}write-audits/").content.decode()
    assert "send_notification" in page and agent_run.pending_call["idempotency_key"] in page
    response = operator_client.post(
        f"{RUNS}{agent_run.pk}/reconcile/",
        {"outcome": "not_applied", "note": "", "next": f"{RUNS}write-audits/"},
    )
    assert response.status_code == 400
    assert AgentRun.objects.get(pk=agent_run.pk).reconciliation is None  # note required
    response = operator_client.post(
        f"{RUNS}{agent_run.pk}/reconcile/",
        {"outcome": "not_applied", "note": "never arrived", "next": "https://evil.example/"},
    )
    assert response["Location"] == detail(agent_run)  # no open redirect
    operator_client.post(f"{RUNS}{agent_run.pk}/requeue/", {"note": "resend"})
    assert AgentRun.objects.get(pk=agent_run.pk).status == "completed"
    assert OutboxNotification.objects.count() == 2


def test_the_reconcile_form_chooses_no_outcome_and_asks_again_beside_the_field(operator_client):
    """``applied`` and ``not_applied`` lead to opposite requeues: the form
    chose "applied" for the operator, who could reconcile without reading."""
    agent_run = audit_failed_run()
    for page in (detail(agent_run), f"{RUNS}write-audits/"):
        content = operator_client.get(page).content.decode()
        (form,) = re.findall(r'<form[^>]*class="reconcile-form".*?</form>', content, re.S)
        outcomes = re.findall(r'<input type="radio" name="outcome"[^>]*>', form)
        assert [re.search(r'value="(\w+)"', radio)[1] for radio in outcomes] == [
            "applied",
            "not_applied",
        ], page
        # Neither chosen; the browser will not send the form without one.
        assert all("checked" not in radio and "required" in radio for radio in outcomes), page
        assert "<select" not in form and "<option" not in form, page

    reconcile = f"{RUNS}{agent_run.pk}/reconcile/"
    sent = {"note": "the pager shows it", "next": f"{RUNS}write-audits/"}
    response = operator_client.post(reconcile, sent)
    assert response.status_code == 400
    content = html.unescape(response.content.decode())
    # The error beside the outcome's radios, the note kept, nothing recorded.
    outcome = re.search(r'<div class="reconcile-outcome">(.*?)</div>\s*<div', content, re.S)[1]
    assert "Choose whether the write landed: applied or not_applied." in outcome
    assert 'class="errorlist' in outcome and 'name="outcome"' in outcome
    assert 'value="the pager shows it"' in content
    assert f'name="next" value="{RUNS}write-audits/"' in content
    assert agent_run.pending_call["idempotency_key"] in content  # the write it is about
    assert 'id="nav-sidebar"' in content  # the admin's frame
    assert AgentRun.objects.get(pk=agent_run.pk).reconciliation is None
    assert not AgentRun.objects.get(pk=agent_run.pk).steps.filter(kind="operator").exists()
    # A value not offered is no choice either.
    assert operator_client.post(reconcile, {**sent, "outcome": "maybe"}).status_code == 400

    response = operator_client.post(reconcile, {**sent, "outcome": "applied"})
    assert response.status_code == 302 and response["Location"] == f"{RUNS}write-audits/"
    assert AgentRun.objects.get(pk=agent_run.pk).reconciliation.outcome == "applied"


def test_dismiss_needs_a_note(operator_client):
    dead_letter = DeadLetter.objects.get(run=safe_failed_run())
    form = {"action": "dismiss_selected", "_selected_action": [dead_letter.pk], "confirm": "yes"}
    page = operator_client.post("/admin/runs/deadletter/", {**form, "note": ""}).content.decode()
    assert "A note is required" in page
    operator_client.post("/admin/runs/deadletter/", {**form, "note": "known outage"})
    dead_letter.refresh_from_db()
    assert (dead_letter.resolution, dead_letter.resolution_note) == ("dismissed", "known outage")


def test_cancel_from_the_list_asks_first(operator_client):
    agent_run = transitions.create_queued_run({"prompt": "p", "tools": []}, "p")
    selected = {"action": "cancel_selected", "_selected_action": [agent_run.pk]}
    page = operator_client.post(RUNS, selected).content.decode()
    assert "will be cancelled:" in page and "queued: cancelled at once, it will not run" in page
    assert AgentRun.objects.get(pk=agent_run.pk).status == "queued"
    operator_client.post(RUNS, {**selected, "confirm": "yes", "note": "not needed"})
    assert AgentRun.objects.get(pk=agent_run.pk).status == "cancelled"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("status__exact=failed", {"safe", "audit"}),
        ("write_in_doubt=yes", {"audit"}),
        ("tool=send_notification", {"audit"}),
        ("termination_reason__exact=completed", {"done"}),
        ("q=hello", {"done"}),
        ("requeues=0", {"safe", "audit", "done"}),
        ("requeues=3%2B", set()),
        ("lease=expired", set()),
    ],
)
def test_filters(operator_client, query, expected):
    runs = {
        "safe": safe_failed_run(),
        "audit": audit_failed_run(),
        "done": run(scripted(answer(), prompt="hello there")),
    }
    content = operator_client.get(f"{RUNS}?{query}").content.decode()
    shown = {name for name, agent_run in runs.items() if str(agent_run.pk) in content}
    assert shown == expected


def test_the_overview_links_its_numbers(operator_client):
    safe, audited = safe_failed_run(), audit_failed_run()
    page = operator_client.get("/admin/").content.decode()  # the overview
    assert 'id="open-dead-letters">2<' in page
    assert 'id="writes-in-doubt">1<' in page
    [link] = re.findall(r'href="([^"]*termination_reason__exact=not_retryable[^"]*)"', page)
    listing = operator_client.get(html.unescape(link))
    assert listing.status_code == 200
    content = listing.content.decode()
    assert str(safe.pk) in content and str(audited.pk) in content


def test_the_runs_list_query_count_does_not_grow_with_rows(operator_client):
    """Each row's submitter and agent version (its columns "by" and "model ·
    agent") come joined in the page's query, not one query per row."""

    def queries_for_list():
        with CaptureQueriesContext(connection) as captured:
            assert operator_client.get(RUNS).status_code == 200
        return len(captured)

    def submitted_from_an_agent(runs):
        # Each run its own submitter and agent: a per-row query would show.
        for number, agent_run in enumerate(runs):
            user = User.objects.create(username=f"submitter-{agent_run.pk}")
            agent = Agent.objects.create(name=f"agent-{agent_run.pk}")
            version = AgentVersion.objects.create(
                agent=agent, number=number + 1, provider={"kind": "scripted"}, max_iterations=5
            )
            AgentRun.objects.filter(pk=agent_run.pk).update(
                submitted_by=user, agent_version=version
            )

    submitted_from_an_agent([safe_failed_run() for _ in range(3)])
    few = queries_for_list()
    submitted_from_an_agent([audit_failed_run() for _ in range(12)])
    page = operator_client.get(RUNS).content.decode()
    assert page.count('class="run-model run-agent"') == 15
    assert queries_for_list() == few


def test_tools_are_switched_but_not_added_deleted_or_relabelled(operator_client):
    page = operator_client.get("/admin/tools/toolsetting/").content.decode()
    assert "non_idempotent_write" in page and "Add tool setting" not in page
    assert operator_client.get("/admin/tools/toolsetting/add/").status_code == 403
    assert operator_client.get("/admin/tools/toolsetting/read_note/delete/").status_code == 403
    with transaction.atomic():
        ToolSetting.objects.filter(name="read_note").update(enabled=False)
    assert not ToolSetting.objects.get(name="read_note").enabled


def test_search_by_run_id_and_by_prompt(operator_client):
    wanted = run(scripted(answer(), prompt="rotate the keys"))
    other = run(scripted(answer(), prompt="something else"))
    for term in [str(wanted.pk), "rotate", "keys rotate"]:
        content = operator_client.get(f"{RUNS}?q={term}").content.decode()
        assert str(wanted.pk) in content and str(other.pk) not in content, term


def test_search_finds_live_runs_by_prompt_and_by_lease_owner(operator_client):
    # The trigram index holds ended runs only; live runs are searched apart.
    request = scripted(answer(), prompt="migrate the billing tables")
    live = transitions.create_queued_run(request, request["prompt"])  # no job: stays queued
    ended = run(scripted(answer(), prompt="migrate the search index"))
    content = operator_client.get(RUNS, {"q": "migrate"}).content.decode()
    assert str(live.pk) in content and str(ended.pk) in content
    # A running run by its worker: the whole term is the lease owner.
    assert transitions.claim(live.pk, "worker-7:4242:beef", 60) is not None
    content = operator_client.get(RUNS, {"q": "WORKER-7:4242:beef"}).content.decode()
    assert str(live.pk) in content and str(ended.pk) not in content


def test_the_django_rq_dashboard_is_reachable_from_the_console(operator_client, queue, settings):
    overview = operator_client.get("/admin/").content.decode()
    assert 'href="/admin/django-rq/"' in overview
    assert operator_client.get("/admin/django-rq/").status_code == 200


def test_the_admin_prompt_search_uses_its_indexes(operator_client):
    """icontains on the prompt (a leading wildcard) OR-ed with the lease owner,
    newest first: with sequential scans priced out, the page's query must ask
    the indexes rather than walk created_at past non-matching rows."""
    from bench.scale import GENERATE_RUNS

    with connection.cursor() as cursor:  # enough ended runs to make an index worth it
        cursor.execute(GENERATE_RUNS, {"runs": 20_000, "steps": 0, "first_team": 1, "teams": 1})
        cursor.execute("ANALYZE runs_agentrun")
    with CaptureQueriesContext(connection) as queries:
        response = operator_client.get(RUNS, {"q": "deploy"})
    assert response.status_code == 200
    [search] = [
        q["sql"] for q in queries.captured_queries if "LIKE" in q["sql"] and "LIMIT" in q["sql"]
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + search)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "runs_agentrun_ended_prompt_trgm" in plan and "runs_agentrun_lease_owner" in plan, plan
    assert "run_status_created_idx" in plan, plan  # live runs, through their status


def test_the_outbox_lists_each_notification_with_its_run_and_key_and_cannot_be_edited(
    admin_client,
):
    agent_run = run(
        scripted(
            call("send_notification", recipient="oncall", message=XSS + " disk full " * 20),
            answer(),
            tools=["send_notification"],
        )
    )
    (notification,) = OutboxNotification.objects.all()
    page = admin_client.get("/admin/tools/outboxnotification/").content.decode()
    assert f'href="/admin/runs/agentrun/{agent_run.pk}/change/"' in page
    assert notification.idempotency_key in page and "oncall" in page
    assert "&lt;script&gt;" in page and XSS not in page
    assert "/admin/tools/outboxnotification/add/" not in page and "delete_selected" not in page
    detail = f"/admin/tools/outboxnotification/{notification.pk}/change/"
    assert admin_client.get(detail).status_code == 200
    admin_client.post(detail, {"recipient": "someone else"})
    assert admin_client.post("/admin/tools/outboxnotification/add/", {}).status_code == 403
    assert OutboxNotification.objects.get().recipient == "oncall"
