"""Bulk requeue, restart and cancel with a preview (issue #41, item 2), in
the admin's runs list and through ``POST /api/runs/bulk/``: the preview
gives each run its own verdict and changes nothing; confirmed, each run
goes through its single-run action, decided again as it is then, audited
as each operator action is (G11), the refused ones untouched, and the
message counts done and refused by reason; a run changed since the
preview is refused ``changed``; more than ``MAX_RUNS`` runs do nothing."""

import html
import re

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from runs import transitions
from runs.models import AgentRun
from runs.models.vocabulary import RunStatus
from runs.operators import actions as operator_actions
from runs.operators import bulk
from runs.runtime import enqueue
from tests.helpers import answer, call, fresh, run_when_due, scripted
from tests.test_console import audit_failed_run
from tests.test_console_actions import auth_failed_run, messages_on

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/runs/agentrun/"
BULK = "/api/runs/bulk/"
#: A well-formed run id no run has.
UNKNOWN = "0b6f1d2e-5c3a-4f8e-9d21-7a4b3c2d1e0f"


def safe_failed_run(prompt="Summarise the incidents"):
    """Searched, then its model refused the key once: requeued, it completes."""
    return fresh(
        enqueue(
            scripted(
                call("search_notes", query="incident"),
                {"error": "auth", "attempts": 1},
                answer("found"),
                tools=["search_notes"],
                prompt=prompt,
            )
        )
    )


def completed_run():
    return fresh(enqueue(scripted(answer("ok"), prompt="Say ok")))


def queued_runs(count: int) -> list:
    """``count`` queued runs, inserted at once: enough to pass the cap."""
    return AgentRun.objects.bulk_create(
        AgentRun(
            request={"prompt": "p", "tools": []}, prompt="p", status=RunStatus.QUEUED, mode="queued"
        )
        for _ in range(count)
    )


def operator_steps(agent_run) -> int:
    return agent_run.steps.filter(kind="operator").count()


def logged(agent_run) -> int:
    return LogEntry.objects.filter(object_id=str(agent_run.pk)).count()


def row_of(page: str, agent_run) -> str:
    row = re.search(
        rf'<tr class="verdict-(?:ok|no)" id="bulk-{agent_run.pk}">(.*?)</tr>', page, re.S
    )
    assert row, agent_run.pk
    return html.unescape(re.sub(r"<[^>]+>", "", row[1]))


def test_a_bulk_requeue_previews_each_verdict_then_applies_each_under_its_own(
    operator, operator_client
):
    safe, changing = safe_failed_run(), auth_failed_run("Find the outage")
    doubt, done = audit_failed_run(), completed_run()
    selected = {
        "action": "requeue_selected",
        "_selected_action": [run.pk for run in (safe, changing, doubt, done)],
    }

    with CaptureQueriesContext(connection) as preview_queries:
        page = operator_client.post(RUNS, selected).content.decode()

    counts = re.search(r'<p id="bulk-counts">(.*?)</p>', page)[1]
    assert re.fullmatch(
        r"Will requeue 2; refused 2: (write_in_doubt 1, status 1|status 1, write_in_doubt 1) "
        r"\(of 4 runs\)\.",
        counts,
    ), counts
    assert "refused (write_in_doubt): the non_idempotent_write 'send_notification' may have" in (
        row_of(page, doubt)
    )
    assert "refused (status): only failed or cancelled runs" in row_of(page, done)
    assert 'id="lasting-failure-warning"' in page  # they failed with auth
    # Bounded: the runs and their reconciliations one query each for all of
    # them; then what a verdict must read, each run's journal (the refused
    # ones refused before reading it); the page's chrome, with the user's
    # team roles read once and the runs' teams in one query (G22).
    sql = [query["sql"] for query in preview_queries]
    assert sum('FROM "runs_writereconciliation"' in one for one in sql) == 1
    assert sum('FROM "runs_runstep" step' in one for one in sql) == 2, sql
    assert sum('FROM "teams_membership"' in one for one in sql) <= 1, sql
    assert len(sql) <= 18, sql
    assert all(operator_steps(run) == 0 for run in (safe, changing, doubt, done))

    # Meanwhile another operator requeued one of them; it failed again, and
    # is as safe to requeue as before, but no longer what the preview showed.
    assert operator_actions.requeue(fresh(changing), operator, "").ok
    assert fresh(changing).status == RunStatus.FAILED
    confirm = {
        **selected,
        **{
            f"seen-{run.pk}": f"{run.status}:{run.step_count}"
            for run in (safe, changing, doubt, done)
        },
        "confirm": "yes",
        "note": "key rotated",
        "back": "status__exact=failed",
    }
    response = operator_client.post(RUNS, confirm, follow=True)

    assert response.redirect_chain[-1][0] == f"{RUNS}?status__exact=failed"
    (message,) = messages_on(response)
    head, _, by_reason = message.rstrip(".").partition(": ")
    assert head == "Requeued 1; refused 3"
    assert set(by_reason.split(", ")) == {"write_in_doubt 1", "status 1", "changed 1"}
    # The requeued run: its operator step and log entry, written as one
    # requeue writes them; it resumed and completed in-process.
    safe = fresh(safe)
    (step,) = safe.steps.filter(kind="operator")
    assert (step.result["action"], step.result["note"]) == ("requeue", "key rotated")
    assert logged(safe) == 1 and safe.status == RunStatus.COMPLETED
    # The refused: untouched (the changed one holds only the other requeue).
    assert (operator_steps(fresh(doubt)), logged(doubt), fresh(doubt).status) == (0, 0, "failed")
    assert (operator_steps(fresh(done)), logged(done)) == (0, 0)
    assert (operator_steps(fresh(changing)), logged(changing)) == (1, 1)
    assert fresh(changing).status == RunStatus.FAILED


def test_after_a_bulk_requeue_the_message_names_the_runs_already_failed_again_as_it_is_read(
    operator_client, queue
):
    """Issue #47. "Already" is as the operator reads the message: the runs
    sent back that have ended failed by the time the list it is on renders
    (with RQ a worker may take them between the action and that page)."""
    with override_settings(REDIS_URL=""):  # made in this process, before RQ
        fails, fails_too = auth_failed_run("Find the outage"), auth_failed_run()
        recovers = safe_failed_run("Page on-call")
    runs = (fails, fails_too, recovers)
    confirm = {
        "action": "requeue_selected",
        "_selected_action": [run.pk for run in runs],
        **{f"seen-{run.pk}": f"{run.status}:{run.step_count}" for run in runs},
        "confirm": "yes",
        "note": "key rotated?",
    }
    assert operator_client.post(RUNS, confirm).status_code == 302
    assert {fresh(run).status for run in runs} == {RunStatus.QUEUED}  # RQ has them
    # A worker takes them before the operator's list comes back.
    for run in runs:
        run_when_due(run.pk)
    assert [fresh(run).status for run in runs] == ["failed", "failed", "completed"]

    response = operator_client.get(RUNS)

    (message,) = messages_on(response)
    first, second = sorted((fails, fails_too), key=lambda run: run.created_at)
    assert message == (
        f"Requeued 3. 2 of the 3 requeued have already failed again: "
        f"{str(first.pk)[:8]} (auth), {str(second.pk)[:8]} (auth)."
    )
    page = response.content.decode()
    assert '<li class="warning">Requeued 3. 2 of the 3' in page
    for run in (fails, fails_too):
        assert f'href="{RUNS}{run.pk}/change/"' in page
    assert not messages_on(operator_client.get(RUNS))  # said once


def test_all_runs_matching_the_filter_are_previewed_and_cancelled_within_the_cap(
    operator_client,
):
    queued = [
        transitions.create_queued_run({"prompt": f"p{n}", "tools": []}, f"p{n}") for n in "12"
    ]
    done = completed_run()
    filtered = f"{RUNS}?status__exact=queued"
    # Select all (Django's "select across"): one page's box ticked, every match meant.
    across = {
        "action": "cancel_selected",
        "select_across": "1",
        "index": "0",
        "_selected_action": [queued[0].pk],
    }

    page = operator_client.post(filtered, across).content.decode()

    assert "Will cancel 2 (of 2 runs)" in page
    assert all(f'id="bulk-{run.pk}"' in page for run in queued)
    assert f'id="bulk-{done.pk}"' not in page  # not matched by the filter
    assert 'name="back" value="status__exact=queued"' in page
    assert "will be cancelled: queued: cancelled at once, it will not run" in row_of(
        page, queued[0]
    )

    # More than the cap: refused whole, nothing previewed or done.
    beyond = queued_runs(bulk.MAX_RUNS - 1)
    refused = operator_client.post(filtered, across, follow=True)
    (message,) = messages_on(refused)
    assert message.startswith(f"Nothing was done: more than {bulk.MAX_RUNS} runs are selected")
    assert AgentRun.objects.filter(status=RunStatus.QUEUED).count() == bulk.MAX_RUNS + 1
    AgentRun.objects.filter(pk__in=[run.pk for run in beyond]).delete()

    confirm = {
        "action": "cancel_selected",
        "_selected_action": [run.pk for run in (*queued, done)],
        "confirm": "yes",
        "note": "provider down",
    }
    response = operator_client.post(RUNS, confirm, follow=True)

    (message,) = messages_on(response)
    assert message == "Cancelled 2; refused 1: not_cancellable 1."
    for run in queued:
        run = fresh(run)
        assert run.status == RunStatus.CANCELLED
        assert run.steps.get(kind="operator").result["note"] == "provider down"
        assert logged(run) == 1
    assert (operator_steps(fresh(done)), logged(done)) == (0, 0)


def test_the_api_previews_then_applies_each_run_under_its_own_verdict(
    api, operator, viewer, api_token
):
    from rest_framework.test import APIClient

    safe, changing = safe_failed_run(), auth_failed_run("Find the outage")
    doubt, done = audit_failed_run(), completed_run()
    ids = [str(run.pk) for run in (safe, changing, doubt, done)] + [UNKNOWN]
    body = {"action": "requeue", "ids": ids}
    viewer_api = APIClient()
    viewer_api.credentials(HTTP_AUTHORIZATION=api_token(viewer))

    # A viewer may preview, as it may read a run's verdict; never act.
    preview = viewer_api.post(BULK, {**body, "preview": True}, format="json")
    assert viewer_api.post(BULK, body, format="json").status_code == 403

    assert preview.status_code == 200, preview.content
    previewed = preview.json()
    assert (previewed["runs"], previewed["done"], previewed["refused"]) == (5, 2, 3)
    assert previewed["refused_by_code"] == {"write_in_doubt": 1, "status": 1, "not_found": 1}
    assert [one["code"] for one in previewed["results"]] == [
        "safe",
        "safe",
        "write_in_doubt",
        "status",
        "not_found",
    ]
    assert previewed["results"][0]["detail"].startswith("resumes after step 3")
    assert all(operator_steps(run) == 0 for run in (safe, changing, doubt, done))
    # Meanwhile another operator requeued one; it failed again, still safe.
    assert operator_actions.requeue(fresh(changing), operator, "").ok

    seen = {one["id"]: one["seen"] for one in previewed["results"] if one["seen"]}
    applied = api.post(BULK, {**body, "note": "key rotated", "seen": seen}, format="json").json()

    assert applied["summary"] == (
        "requeued 1; refused 4: changed 1, write_in_doubt 1, status 1, not_found 1"
    )
    assert [one["ok"] for one in applied["results"]] == [True, False, False, False, False]
    assert fresh(safe).status == RunStatus.COMPLETED and logged(safe) == 1
    assert fresh(safe).steps.get(kind="operator").result["note"] == "key rotated"
    assert (operator_steps(fresh(doubt)), logged(doubt)) == (0, 0)
    assert (operator_steps(fresh(changing)), logged(changing)) == (1, 1)

    # By filter: the failed runs, newest first.
    by_filter = api.post(
        BULK, {"action": "restart", "filter": {"status": "failed"}, "preview": True}, format="json"
    ).json()
    assert [one["id"] for one in by_filter["results"]] == [str(doubt.pk), str(changing.pk)]
