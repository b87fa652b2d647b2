"""The admin's index is the overview (issue #30): each number links to a
list of exactly its rows, the header counts the calls waiting for approval
on every page, the reaper's and the workers' liveness, the hourly charts,
and what a user who may not view runs sees (none of it)."""

import html
import re
import threading
import time
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from rq import Worker

from runs import transitions
from runs.models import AgentRun, DeadLetter
from runs.models.last_passes import EMBEDDED_WORKER, REAPER, LastPass
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from runs.transitions import db_time
from runs.workers.embedded import serve
from runs.workers.run_threads import RunThreads
from spend.budgets import database_now
from tests.conftest import _client_for, _user
from tests.helpers import answer, call, fresh, scripted
from tests.test_console import XSS, audit_failed_run, safe_failed_run

pytestmark = pytest.mark.django_db(transaction=True)

INDEX = "/admin/"
RUNS = "/admin/runs/agentrun/"
IDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def number(page: str, element_id: str) -> tuple[int, str]:
    """The number an element of the page shows, and where it links."""
    found = re.search(rf'<a href="([^"]*)" id="{element_id}">(\d+)', page)
    assert found, f"no linked number #{element_id}"
    return int(found[2]), html.unescape(found[1])


def runs_listed(client, url: str, among) -> set:
    """Which of the runs ``among`` the list at ``url`` shows."""
    response = client.get(url)
    assert response.status_code == 200, url
    shown = set(IDS.findall(response.content.decode()))
    return {str(run.pk) for run in among} & shown


def waiting_run(settings):
    """A run whose write waits for an approval (as shipped: writes wait)."""
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "non_idempotent_write"
    notify = call("send_notification", recipient="team", message="v2 is out")
    return fresh(enqueue(scripted(notify, answer(), tools=["send_notification"])))


def queued_run(prompt="p"):
    return transitions.create_queued_run({"prompt": prompt, "tools": []}, prompt)


def test_each_number_links_to_exactly_its_runs(operator_client, settings):
    in_doubt = audit_failed_run()  # before approvals: its write is not held
    waiting = waiting_run(settings)
    dead_now, dead_before = safe_failed_run(), safe_failed_run()
    DeadLetter.objects.filter(run=dead_before).update(created_at=db_time(-3 * 86400))
    DeadLetter.objects.filter(run=dead_before).update(resolved_at=db_time())  # resolved
    running, expired = queued_run("running"), queued_run("expired")
    assert transitions.claim(running.pk, "worker-1", 600) is not None
    assert transitions.claim(expired.pk, "worker-2", -60) is not None  # a lapsed lease
    due, overdue = queued_run("due"), queued_run("overdue")
    AgentRun.objects.filter(pk=overdue.pk).update(available_at=db_time(-3600))
    every = [waiting, in_doubt, dead_now, dead_before, running, expired, due, overdue]

    page = operator_client.get(INDEX).content.decode()

    expected = {
        "runs-waiting-for-approval": {waiting},
        "writes-in-doubt": {in_doubt},
        "open-dead-letters": {in_doubt, dead_now},
        "dead-letters-last-day": {in_doubt, dead_now},
        "running": {running, expired},
        "lease-expired": {expired},
        "queued": {due, overdue},
        "overdue": {overdue},
    }
    for element_id, runs in expected.items():
        count, link = number(page, element_id)
        assert count == len(runs), element_id
        assert runs_listed(operator_client, link, every) == {str(r.pk) for r in runs}, element_id
    # The calls waiting link to the inbox, which lists the waiting run's.
    count, link = number(page, "pending-approvals")
    assert (count, link) == (1, f"{RUNS}approvals/")
    assert runs_listed(operator_client, link, every) == {str(waiting.pk)}
    assert "NRLLM_REDISPATCH_AFTER_SECONDS" in page  # what "overdue" means


def test_the_old_overview_address_leads_to_the_index(operator_client):
    response = operator_client.get(f"{RUNS}overview/?window=7d")
    assert (response.status_code, response["Location"]) == (302, f"{INDEX}?window=7d")
    assert operator_client.get(f"{RUNS}overview/")["Location"] == INDEX


def test_the_app_list_stays_on_the_index(operator_client):
    page = operator_client.get(INDEX).content.decode()
    sidebar = page[page.index('id="content-related"') :]
    for listed in ("/admin/runs/agentrun/", "/admin/runs/deadletter/", "/admin/tools/"):
        assert f'href="{listed}' in sidebar, listed
    assert 'id="now"' in page and 'id="liveness"' in page and 'id="runs-chart"' in page


def test_the_header_counts_waiting_calls_on_every_page_once(operator, operator_client, settings):
    waiting_run(settings)
    with CaptureQueriesContext(connection) as queries:
        page = operator_client.get(RUNS).content.decode()
    header = re.search(r'<a id="header-approvals" href="([^"]*)"[^>]*>([^<]*)</a>', page)
    assert header and header[1] == f"{RUNS}approvals/"
    assert header[2] == "1 call waiting for approval"
    counts = [q for q in queries.captured_queries if "runs_approvalrequest" in q["sql"]]
    assert len(counts) == 1, counts
    # Asked twice in a request (a view rendering another's), counted once.
    request = RequestFactory().get(RUNS)
    request.user = operator
    with CaptureQueriesContext(connection) as queries:
        first, second = admin.site.each_context(request), admin.site.each_context(request)
    assert first["pending_approvals"] == second["pending_approvals"] == 1
    assert len([q for q in queries.captured_queries if "runs_approvalrequest" in q["sql"]]) == 1
    # The index shows the same count without asking again.
    with CaptureQueriesContext(connection) as queries:
        page = operator_client.get(INDEX).content.decode()
    assert number(page, "pending-approvals")[0] == 1 and 'id="header-approvals"' in page
    assert len([q for q in queries.captured_queries if "runs_approvalrequest" in q["sql"]]) == 1


def test_a_user_who_may_not_view_runs_sees_no_count_and_no_overview(settings):
    waiting_run(settings)
    tools_only = _user("tess", staff=True, permissions=["tools.view_toolsetting"])
    client = _client_for(tools_only)
    for url in (INDEX, "/admin/tools/toolsetting/"):
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        assert response.status_code == 200, url
        page = response.content.decode()
        assert "header-approvals" not in page and "waiting for approval" not in page, url
        assert not [q for q in queries.captured_queries if "runs_" in q["sql"]], url
    page = client.get(INDEX).content.decode()
    assert 'id="now"' not in page and 'id="liveness"' not in page and "spend-chart" not in page
    assert 'href="/admin/tools/toolsetting/"' in page  # Django's app list, as it is
    assert client.get(f"{RUNS}overview/").status_code == 302  # to the index: nothing there
    # An API account (not staff) may view runs, but the admin is not its
    # place: its login page shows no count either.
    api_account = _client_for(_user("ivy", staff=False, permissions=["runs.view_agentrun"]))
    assert 'id="header-approvals"' not in api_account.get("/admin/login/").content.decode()


def test_the_embedded_workers_pass_is_shown_alive(operator_client):
    stop = threading.Event()
    worker = threading.Thread(
        target=serve, kwargs={"interval": 0.05, "runs": RunThreads(1), "stop": stop}
    )
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while not LastPass.objects.filter(name=EMBEDDED_WORKER).exists():
            assert time.monotonic() < deadline, "the embedded worker recorded no pass"
            time.sleep(0.05)
    finally:
        stop.set()
        worker.join(timeout=30)
    page = operator_client.get(INDEX).content.decode()
    liveness = re.search(r'id="liveness">.*?</table>', page, re.S)[0]
    assert "Embedded worker" in liveness and '<span class="badge alive">alive</span>' in liveness
    assert "not seen" not in liveness and "RQ workers" not in liveness  # no Redis here


def test_a_reaper_pass_is_shown_alive_then_not_seen_when_it_stops(operator_client, queue):
    page = operator_client.get(INDEX).content.decode()
    assert "Reaper (rqcron runs.cron)" in page and '<span class="badge stale">never seen' in page
    reap_stale_runs()
    assert LastPass.objects.get(name=REAPER).every_seconds == 10  # the shipped interval
    page = operator_client.get(INDEX).content.decode()
    reaper = re.search(r"Reaper \(rqcron runs.cron\)</th>(.*?)</tr>", page, re.S)[1]
    assert '<span class="badge alive">alive</span>' in reaper, reaper
    # The reaper stopped an hour ago: its last pass is that old.
    an_hour_ago = database_now() - timedelta(hours=1)
    LastPass.objects.update(at=an_hour_ago)
    reap_stale_runs(as_of=database_now())  # a pass as of another time: no sign of life
    page = operator_client.get(INDEX).content.decode()
    reaper = re.search(r"Reaper \(rqcron runs.cron\)</th>(.*?)</tr>", page, re.S)[1]
    assert f"not seen since {an_hour_ago:%Y-%m-%d %H:%M:%S} UTC" in reaper, reaper
    assert "last pass 60 min ago" in reaper and "a pass within 30 s" in reaper


def test_a_pass_rewrites_its_row_at_most_every_few_seconds():
    reap_stale_runs()
    first = LastPass.objects.get(name=REAPER).at
    reap_stale_runs()
    assert LastPass.objects.get(name=REAPER).at == first  # younger than 5 s: not written
    LastPass.objects.update(at=db_time(-6))
    reap_stale_runs()
    assert LastPass.objects.get(name=REAPER).at > first


def test_process_names_are_escaped(operator_client):
    LastPass.objects.create(name=EMBEDDED_WORKER, at=database_now(), process=XSS, every_seconds=1)
    page = operator_client.get(INDEX).content.decode()
    assert XSS not in page and "&lt;script&gt;" in page


def test_a_real_rq_worker_is_shown_with_its_heartbeat(operator_client, workers):
    workers.start()
    deadline = time.monotonic() + 60
    while not (registered := Worker.all(queue=workers_queue(workers))):
        assert time.monotonic() < deadline, "the worker did not register in Redis"
        time.sleep(0.2)
    page = operator_client.get(INDEX).content.decode()
    liveness = re.search(r'id="liveness">.*?</table>', page, re.S)[0]
    assert '<span class="badge alive">1 alive</span>' in liveness, liveness
    assert registered[0].name in liveness and "heartbeat " in liveness


def workers_queue(workers):
    from runs.queue.dispatch import run_queue

    return run_queue()


def test_redis_down_leaves_the_index_up(operator_client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    started = time.monotonic()
    response = operator_client.get(INDEX)
    assert response.status_code == 200
    assert "Redis unreachable (ConnectionError)" in response.content.decode()
    assert time.monotonic() - started < 5
    # Malformed (every run fails dispatch_failed then): this page says so.
    settings.REDIS_URL = "redis://127.0.0.1:notaport/0"
    response = operator_client.get(INDEX)
    assert response.status_code == 200
    assert "Redis unusable (ValueError)" in response.content.decode()


def test_the_charts_count_the_window_per_hour_and_link_each_series(operator_client):
    recent = [safe_failed_run(), fresh(enqueue(scripted(answer())))]
    older = fresh(enqueue(scripted(answer())))
    AgentRun.objects.filter(pk=older.pk).update(created_at=db_time(-3 * 86400))
    every = [*recent, older]

    day = operator_client.get(INDEX).content.decode()
    week = operator_client.get(f"{INDEX}?window=7d").content.decode()

    def chart(page, chart_id):
        return re.search(rf'<svg id="{chart_id}".*?</svg>', page, re.S)[0]

    assert chart(day, "runs-chart").count('<g class="hour">') == 24
    assert chart(week, "runs-chart").count('<g class="hour">') == 168
    assert 'id="window-7d" class="selected"' in week
    for page, runs in ((day, recent), (week, every)):
        completed, link = number(page, "outcome-completed")
        assert completed == len(runs) - 1
        assert runs_listed(operator_client, link, every) == {str(r.pk) for r in runs[1:]}
        failed, link = number(page, "failures-class-auth")
        assert failed == 1 and runs_listed(operator_client, link, every) == {str(recent[0].pk)}
    # A bar's link lists its hour's runs; its tooltip counts them.
    [hour] = re.findall(r'<a href="([^"]*)">\s*<title>([^<]*2 runs[^<]*)</title>', day)
    assert "1 completed, 1 failed" in html.unescape(hour[1])
    assert runs_listed(operator_client, html.unescape(hour[0]), every) == {
        str(r.pk) for r in recent
    }


def test_the_index_queries_do_not_grow_with_runs(operator_client, operator):
    operator.user_permissions.add(Permission.objects.get(codename="view_dailyspend"))

    def queries():
        with CaptureQueriesContext(connection) as captured:
            assert operator_client.get(INDEX).status_code == 200
        return len(captured)

    safe_failed_run()
    few = queries()
    for _ in range(5):
        safe_failed_run()
        audit_failed_run()
        queued_run()
    assert queries() == few


def test_the_charts_query_reads_the_created_at_index_alone(operator_client):
    for _ in range(3):
        enqueue(scripted(answer()))
    with CaptureQueriesContext(connection) as queries:
        assert operator_client.get(f"{INDEX}?window=7d").status_code == 200
    (chart,) = [q["sql"] for q in queries if "DATE_BIN" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("VACUUM runs_agentrun")  # as autovacuum leaves it
        cursor.execute("SET enable_seqscan = off")  # three rows: as at scale
        cursor.execute(f"EXPLAIN {chart}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
    # No run's row visited: the index holds every column the charts read.
    assert "Index Only Scan using run_created_idx" in plan, plan
