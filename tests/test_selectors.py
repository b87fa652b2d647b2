"""The shared run queries: one definition of a write in doubt, for a queryset
(admin filter, API filter, metrics) and for one run (the API's field), in
one query for a page of runs; the tool filter, the same on PostgreSQL and
SQLite."""

import json

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.models import AgentRun, WriteReconciliation
from runs.models.selectors import (
    is_write_in_doubt,
    note_writes_in_doubt,
    offering_tool,
    writes_in_doubt,
)
from tests.helpers import call, manage, scripted, sqlite_env

pytestmark = pytest.mark.django_db


def make_run(status, fence="", *, token=1, key="k1"):
    return AgentRun.objects.create(
        request={"prompt": "p"},
        prompt="p",
        status=status,
        pending_effect=fence,
        pending_call={"tool": "send_notification", "arguments": {}, "idempotency_key": key}
        if fence
        else None,
        lease_token=token,
    )


def reconcile(run, *, token, key):
    WriteReconciliation.objects.create(
        run=run,
        lease_token=token,
        idempotency_key=key,
        outcome="not_applied",
        note="checked",
        operator=User.objects.get(username="olivia"),
    )


def test_a_write_in_doubt_is_the_same_for_a_queryset_and_for_one_run(operator):
    in_doubt = make_run("failed", "non_idempotent_write")
    reconciled = make_run("failed", "non_idempotent_write")
    reconcile(reconciled, token=1, key="k1")
    in_progress = make_run("running", "non_idempotent_write")  # a write under way
    # An idempotent write no turn of its journal asks for: a requeue would
    # not run it again with its key (test_writes_in_doubt_agree.py makes
    # the ones that would, and would not, with the runtime).
    idempotent = make_run("failed", "idempotent_write")
    idempotent_reconciled = make_run("failed", "idempotent_write")
    reconcile(idempotent_reconciled, token=1, key="k1")
    cancelled = make_run("cancelled", "non_idempotent_write")
    make_run("completed")
    # A reconciliation settles the one write it was made for (issue 16).
    later_write = make_run("failed", "non_idempotent_write", token=2, key="k2")
    reconcile(later_write, token=1, key="k1")
    same_call_again = make_run("failed", "non_idempotent_write", token=3, key="k1")
    reconcile(same_call_again, token=2, key="k1")

    runs = AgentRun.objects.prefetch_related("reconciliations")
    by_row = {run.pk for run in runs if is_write_in_doubt(run)}
    by_query = set(writes_in_doubt(AgentRun.objects.all()).values_list("pk", flat=True))
    expected = {in_doubt.pk, cancelled.pk, later_write.pk, same_call_again.pk, idempotent.pk}
    assert by_row == by_query == expected
    assert {reconciled.pk, in_progress.pk, idempotent_reconciled.pk}.isdisjoint(by_row)
    # A page of runs asks about its idempotent writes once, not once per run.
    page = list(AgentRun.objects.prefetch_related("reconciliations"))
    with CaptureQueriesContext(connection) as queries:
        note_writes_in_doubt(page)
        assert {run.pk for run in page if is_write_in_doubt(run)} == expected
    assert len(queries) == 1, queries.captured_queries


#: prompt → request. Only the first offers ``search_notes``; the others
#: mention the name elsewhere, or a name like it.
TOOL_FILTER_RUNS = {
    "offers it": scripted(tools=["read_note", "search_notes"]),
    "scripts a call of it": scripted(call("search_notes", query="x"), tools=["read_note"]),
    "prompts it": scripted(prompt='use "search_notes"'),
    "offers another case": scripted(tools=["Search_Notes"]),
    "offers a longer name": scripted(tools=["search_notes_v2"]),
    "offers nothing": {"prompt": "p", "tools": "search_notes"},
}


def test_the_tool_filter_matches_offered_tools_only(admin_client, api):
    runs = {
        prompt: AgentRun.objects.create(request=request, prompt=prompt, status="completed").pk
        for prompt, request in TOOL_FILTER_RUNS.items()
    }
    matched = offering_tool(AgentRun.objects.all(), "search_notes")
    assert [run.prompt for run in matched] == ["offers it"]
    listed = api.get("/api/runs/?tool=search_notes").json()["results"]
    assert [run["id"] for run in listed] == [str(runs["offers it"])]
    page = admin_client.get("/admin/runs/agentrun/", {"tool": "search_notes"}).content.decode()
    assert [prompt for prompt, pk in runs.items() if str(pk) in page] == ["offers it"]


def test_the_tool_filter_matches_offered_tools_only_on_sqlite_too(tmp_path, migrated):
    migrated(tmp_path / "tool_filter.sqlite3")
    env = sqlite_env(tmp_path / "tool_filter.sqlite3")
    script = (
        "import json, sys\n"
        "from runs.models import AgentRun\n"
        "from runs.models.selectors import offering_tool\n"
        "for prompt, request in json.load(sys.stdin).items():\n"
        "    AgentRun.objects.create(request=request, prompt=prompt, status='completed')\n"
        "print(json.dumps([run.prompt for run in offering_tool(AgentRun.objects.all(), "
        "'search_notes')]))"
    )
    result = manage("shell", "-c", script, env=env, stdin=json.dumps(TOOL_FILTER_RUNS))
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.splitlines()[-1]) == ["offers it"]
