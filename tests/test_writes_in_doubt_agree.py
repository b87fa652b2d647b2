"""A write in doubt is one thing everywhere (G10; issue 47): for a run in
each state that leaves a write on its fence, the console's count on the
overview, the runs list's filter and its "write in doubt", the failed write
audits page, the ``nrllm_writes_in_doubt`` metric, the API's filter and its
field (of one run and of a page), retention and the requeue and restart
verdicts give the same answer. Each state is made by the runtime itself,
its faults injected at the database; the idempotent ones with a model that
words every answer differently too."""

import re
import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.db.models import F
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runs.models import AgentRun, DeadLetter
from runs.models.faults import run_status_changes_refused, step_inserts_refused
from runs.models.selectors import is_write_in_doubt
from runs.models.vocabulary import StepKind
from runs.operators import actions as operator_actions
from runs.operators.requeue_safety import requeue_safety, restart_safety
from runs.runtime import enqueue, run
from tests.drifting_model import NOTIFY, request_for
from tests.helpers import fresh, the_turn_lost_when_a_note_is_written, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

UPSERT = {"name": "upsert_note", "arguments": {"slug": "release", "body": "v{take}"}}
UNSURE = {"name": "unsure_write", "arguments": {"text": "v2 (take {take})"}}
SLOW = {"name": "slow_write", "arguments": {"seconds": 2}}
TEST_TOOLS = ["tests.tools_for_tests.UnsureWrite", "tests.tools_for_tests.SlowWrite"]


def one_call(model, call):
    plan = [{"calls": [call]}, {"answer": "Done (take {take})."}]
    return request_for(model, plan, [call["name"]])


def audit_failed(model, call):
    with step_inserts_refused(call["name"]):
        return enqueue(one_call(model, call))


def reconciled(agent_run, operator, outcome):
    assert operator_actions.reconcile(fresh(agent_run), operator, outcome, "checked").ok
    return agent_run


def returned_late(model, operator):
    """Executed in a thread, where nothing can stop a tool: past its limit
    the run stops counting on the write, which returns later (G15)."""
    ended = []

    def interactive():
        try:
            ended.append(run(one_call(model, SLOW)))
        finally:
            connection.close()

    caller = threading.Thread(target=interactive)
    caller.start()
    caller.join(timeout=60)
    (agent_run,) = ended
    wait_until(
        lambda: agent_run.steps.filter(kind=StepKind.LATE_RESULT).exists(),
        timeout=30,
        what="the write's late result",
    )
    return agent_run


def in_doubt_again(model, operator):
    """Reconciled not_applied and requeued, its audit fails again: the same
    call, a new attempt, a new write in doubt."""
    agent_run = reconciled(audit_failed(model, NOTIFY), operator, "not_applied")
    with step_inserts_refused(NOTIFY["name"]):
        assert operator_actions.requeue(fresh(agent_run), operator, "again").ok
    return agent_run


def settle_refused_too(model, call):
    """Its audit and its settle refused: left running, for the reaper (G3)."""
    with step_inserts_refused(call["name"]), run_status_changes_refused():
        return enqueue(one_call(model, call))


def turn_lost(model):
    """The turn that asked for an idempotent write lost in a failover, after
    the write ran (G12)."""
    with the_turn_lost_when_a_note_is_written():
        return enqueue(one_call(model, UPSERT))


#: state → (model, builder(model, operator), in doubt, the requeue verdict's code)
STATES = {
    "non-idempotent, outcome unknown: write_interrupted": (
        "scripted",
        lambda model, operator: enqueue(one_call(model, UNSURE)),
        True,
        "write_in_doubt",
    ),
    "non-idempotent, its audit failed": (
        "drifting",
        lambda model, operator: audit_failed(model, NOTIFY),
        True,
        "write_in_doubt",
    ),
    "non-idempotent, returned after its time limit": (
        "scripted",
        returned_late,
        True,
        "write_in_doubt",
    ),
    "non-idempotent, reconciled not_applied": (
        "scripted",
        lambda model, operator: reconciled(audit_failed(model, NOTIFY), operator, "not_applied"),
        False,
        "safe",
    ),
    "non-idempotent, reconciled applied": (
        "scripted",
        lambda model, operator: reconciled(audit_failed(model, NOTIFY), operator, "applied"),
        False,
        "write_applied",
    ),
    "non-idempotent, in doubt again after a requeue": (
        "drifting",
        in_doubt_again,
        True,
        "write_in_doubt",
    ),
    "non-idempotent, its settle refused too: still running": (
        "scripted",
        lambda model, operator: settle_refused_too(model, NOTIFY),
        False,
        "status",
    ),
    "idempotent, its audit failed: runs again with its key": (
        "drifting",
        lambda model, operator: audit_failed(model, UPSERT),
        False,
        "safe",
    ),
    "idempotent, its audit and settle failed: still running": (
        "scripted",
        lambda model, operator: settle_refused_too(model, UPSERT),
        False,
        "status",
    ),
    "idempotent, its turn lost in a failover": (
        "drifting",
        lambda model, operator: turn_lost(model),
        True,
        "write_in_doubt",
    ),
    "idempotent, its turn lost, reconciled not_applied": (
        "scripted",
        lambda model, operator: reconciled(turn_lost(model), operator, "not_applied"),
        False,
        "safe",
    ),
    "no write: completed": (
        "scripted",
        lambda model, operator: enqueue(request_for(model, [{"answer": "ok"}], [])),
        False,
        "status",
    ),
}


def prune_dry_run() -> str:
    out = StringIO()
    call_command("prune_runs", "--older-than", "90d", "--dry-run", stdout=out)
    return out.getvalue()


@pytest.mark.parametrize("state", STATES)
def test_every_surface_counts_the_same_writes_in_doubt(
    state, request, settings, operator, operator_client, api
):
    model, build, in_doubt, verdict = STATES[state]
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, *TEST_TOOLS]
    if model == "drifting":
        request.getfixturevalue("drifting_model")
    agent_run = fresh(build(model, operator))
    run_id = str(agent_run.pk)
    count = int(in_doubt)

    # The console: the overview's count, the list's filter and its row, the
    # failed write audits page.
    overview = operator_client.get("/admin/").content.decode()
    assert f'id="writes-in-doubt">{count}<' in overview
    filtered = operator_client.get("/admin/runs/agentrun/", {"write_in_doubt": "yes"})
    assert (run_id in filtered.content.decode()) is in_doubt
    listed = operator_client.get("/admin/runs/agentrun/").content.decode()
    assert bool(re.search(r'class="run-why">[^<]*write in doubt', listed)) is in_doubt
    audits = operator_client.get("/admin/runs/agentrun/write-audits/").content.decode()
    if in_doubt:
        assert f'id="audit-{run_id}"' in audits and "reconcile-form" in audits

    # The metric.
    settings.NRLLM_METRICS_TOKEN = "scrape"
    metrics = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape").content.decode()
    assert f"nrllm_writes_in_doubt {count}.0" in metrics.splitlines()

    # The API: the field of the run and of a page, the filter both ways.
    assert api.get(f"/api/runs/{run_id}/").json()["write_in_doubt"] is in_doubt
    (row,) = api.get("/api/runs/").json()["results"]
    assert row["write_in_doubt"] is in_doubt
    doubtful = [row["id"] for row in api.get("/api/runs/?write_in_doubt=true").json()["results"]]
    others = [row["id"] for row in api.get("/api/runs/?write_in_doubt=false").json()["results"]]
    assert (doubtful, others) == (([run_id], []) if in_doubt else ([], [run_id]))

    # The verdicts: a requeue refused for the write in doubt exactly when it
    # is one; a restart, which repeats idempotent writes by design, when it
    # is a non-idempotent one.
    requeue, restart = requeue_safety(fresh(agent_run)), restart_safety(fresh(agent_run))
    non_idempotent = agent_run.pending_effect == "non_idempotent_write"
    assert (requeue.code == "write_in_doubt", restart.code == "write_in_doubt") == (
        in_doubt,
        in_doubt and non_idempotent,
    ), (requeue, restart)
    if verdict is not None:
        assert requeue.code == verdict, requeue

    # Retention: an old run is kept for its write in doubt, and for nothing
    # else once its dead letters are dismissed; one that has not ended stays.
    ago = timedelta(days=100)
    AgentRun.objects.filter(pk=run_id).update(
        created_at=F("created_at") - ago, finished_at=F("finished_at") - ago
    )
    assert f"kept, with a question open: writes in doubt {count}," in prune_dry_run()
    for dead_letter in DeadLetter.objects.filter(run=run_id, resolved_at__isnull=True):
        assert operator_actions.dismiss(dead_letter, operator, "kept apart").ok
    deleted = 0 if in_doubt or not agent_run.is_terminal else 1
    assert prune_dry_run().startswith(f"would delete {deleted} run")


def dead_lettered_again(model):
    """An idempotent write whose turn was lost, reconciled not_applied and
    requeued, its turn lost again: in doubt again, with a second dead
    letter (the first resolved by the requeue)."""
    operator = User.objects.get(username="olivia")
    agent_run = reconciled(turn_lost(model), operator, "not_applied")
    with the_turn_lost_when_a_note_is_written():
        assert operator_actions.requeue(fresh(agent_run), operator, "again").ok
    assert DeadLetter.objects.filter(run=agent_run).count() == 2
    return fresh(agent_run)


def queries_of(client, url) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries)


@pytest.mark.parametrize("model", ["scripted", "drifting"])
def test_the_dead_letters_ask_about_their_runs_writes_once_however_many_rows(
    model, request, operator_client
):
    """A run dead-lettered again after a requeue has two rows on the dead
    letters list, the open one first: the page asks about its runs'
    idempotent writes in doubt once, not once per such run."""
    if model == "drifting":
        request.getfixturevalue("drifting_model")
    first = dead_lettered_again(model)
    assert is_write_in_doubt(first)
    one = queries_of(operator_client, "/admin/runs/deadletter/")
    for _ in range(3):
        dead_lettered_again(model)

    assert queries_of(operator_client, "/admin/runs/deadletter/") == one


def preview_queries(operator_client, api, runs) -> tuple[int, int]:
    """The queries of a bulk requeue's preview of ``runs``, in the console
    and through the API."""
    ticked = {"action": "requeue_selected", "_selected_action": [run.pk for run in runs]}
    with CaptureQueriesContext(connection) as console:
        page = operator_client.post("/admin/runs/agentrun/", ticked).content.decode()
    assert f"refused {len(runs)}: write_in_doubt {len(runs)}" in page
    body = {"action": "requeue", "ids": [str(run.pk) for run in runs], "preview": True}
    with CaptureQueriesContext(connection) as through_api:
        answer = api.post("/api/runs/bulk/", body, format="json").json()
    assert answer["refused_by_code"] == {"write_in_doubt": len(runs)}, answer
    return len(console), len(through_api)


@pytest.mark.parametrize("model", ["scripted", "drifting"])
def test_a_bulk_preview_asks_about_its_runs_idempotent_writes_once(
    model, request, operator_client, api
):
    """A run refused for a write in doubt reads nothing more (docs/console.md):
    the preview asks about its runs' idempotent writes once, however many."""
    if model == "drifting":
        request.getfixturevalue("drifting_model")
    runs = [fresh(turn_lost(model))]
    one = preview_queries(operator_client, api, runs)
    runs += [fresh(turn_lost(model)) for _ in range(3)]

    assert preview_queries(operator_client, api, runs) == one
