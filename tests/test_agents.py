"""G18: agents, defined once and started by name, each run on one exact
version. Real PostgreSQL, Redis and rqworker processes; the model is the
local chat-completions server (and, for the resume, the scripted provider
too): the instructions reach it as the system message, an agent edited
while its run waits for approval changes nothing of that run, and a bad
agent or start is a 400 naming the field that stores nothing."""

import io
import json
import threading
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from rest_framework.test import APIClient

from agents.models import Agent, AgentVersion
from agents.versions import save_agent
from runs.approvals import actions as approval_actions
from runs.models import AgentRun, ApprovalRequest
from runs.models.vocabulary import RunStatus, StepKind
from spend.models import ModelPrice
from tests.drifting_model import NOTIFY, SEARCH, request_for
from tests.helpers import fresh, wait_until
from tools.models import OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)

ON_CALL = "You are the on-call assistant. Never restart production without a ticket."
TOOLS = ["search_notes", "send_notification"]
PLAN = [{"calls": [SEARCH]}, {"calls": [NOTIFY]}, {"answer": "sent (take {take})"}]
SCRIPTED = {"kind": "scripted", "turns": [{"content": "ok"}]}


def define(api, name, **definition):
    answer = api.post("/api/agents/", {"name": name, **definition}, format="json")
    assert answer.status_code == 201, answer.json()
    return answer.json()["agent"]


def test_a_run_started_by_agent_name_sends_the_instructions_as_the_system_message(
    api, fake_openai, tmp_path
):
    define(
        api,
        "on-call",
        instructions=ON_CALL,
        provider={"kind": "openai", "model": "fake-model"},
        tools=["read_note"],
    )
    answer = api.post("/api/runs/", {"agent": "on-call", "input": "Is checkout up?"}, format="json")

    assert answer.status_code == 201, answer.json()
    shown = answer.json()
    assert (shown["status"], shown["output"]) == (RunStatus.COMPLETED, "done"), shown
    assert shown["agent"]["name"] == "on-call" and shown["agent"]["version"] == 1
    (sent,) = fake_openai.requests
    assert sent["body"]["messages"][:2] == [
        {"role": "system", "content": ON_CALL},
        {"role": "user", "content": "Is checkout up?"},
    ]
    assert [tool["function"]["name"] for tool in sent["body"]["tools"]] == ["read_note"]
    # The stored request is the version's definition: what a resume replays.
    run = AgentRun.objects.get(pk=shown["id"])
    assert run.request["instructions"] == ON_CALL
    assert run.agent_version == AgentVersion.objects.get(agent__name="on-call", number=1)

    # The command line starts by name too.
    start = tmp_path / "start.json"
    start.write_text(json.dumps({"agent": "on-call", "input": "And now?"}))
    call_command("enqueue_run", str(start))
    out = io.StringIO()
    call_command("run_agent", str(start), stdout=out)
    assert json.loads(out.getvalue())["status"] == RunStatus.COMPLETED
    assert AgentRun.objects.filter(agent_version__agent__name="on-call").count() == 3
    assert [sent["body"]["messages"][0]["content"] for sent in fake_openai.requests] == [
        ON_CALL
    ] * 3


@pytest.mark.worker
@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_an_agent_edited_while_its_run_waits_for_approval_resumes_with_the_old_version(
    model, api, approvals, workers, operator, fake_openai
):
    kind = "scripted" if model is None else "drifting"
    request = request_for(kind, PLAN, TOOLS)
    define(api, "notifier", instructions=ON_CALL, provider=request["provider"], tools=TOOLS)
    started = api.post(
        "/api/runs/", {"agent": "notifier", "input": request["prompt"]}, format="json"
    )
    assert started.status_code == 201, started.json()
    run = AgentRun.objects.get(pk=started.json()["id"])
    workers.run_burst()
    assert fresh(run).status == RunStatus.WAITING_FOR_APPROVAL

    # Edited while the run waits: other instructions, and no write tool.
    edited = api.patch(
        "/api/agents/notifier/",
        {"instructions": "Say nothing to anyone.", "tools": ["search_notes"]},
        format="json",
    )
    assert edited.status_code == 200, edited.json()
    assert edited.json()["agent"]["latest"]["number"] == 2
    (approval,) = ApprovalRequest.objects.filter(run=run)
    assert approval_actions.approve(approval, operator, digest=approval.digest).ok
    workers.run_burst()  # another worker process resumes it

    run = fresh(run)
    assert run.status == RunStatus.COMPLETED, run.error_message
    assert run.agent_version.number == 1
    (notification,) = OutboxNotification.objects.all()  # executed once, as approved
    assert notification.idempotency_key == approval.idempotency_key
    if model is None:
        told = [step.result["instructions"] for step in run.steps.filter(kind=StepKind.LLM)]
        assert told == [ON_CALL] * 3
    else:
        systems = {sent["body"]["messages"][0]["content"] for sent in fake_openai.requests}
        assert systems == {ON_CALL}
        offered = {
            tool["function"]["name"]
            for sent in fake_openai.requests
            for tool in sent["body"]["tools"]
        }
        assert offered == set(TOOLS)
    # A run started now gets version 2.
    again = api.post("/api/runs/", {"agent": "notifier", "input": "hi"}, format="json")
    assert AgentRun.objects.get(pk=again.json()["id"]).agent_version.number == 2


@pytest.mark.parametrize(
    ("definition", "field"),
    [
        ({"tools": ["no_such_tool"]}, "tools"),
        ({"max_total_tokens": -5}, "max_total_tokens"),
        ({"max_iterations": 0}, "max_iterations"),
        ({"max_cost": "1.00"}, "max_cost"),  # the scripted model has no price
        ({"webhook": "https://hooks.example.org/x"}, "webhook"),
        ({"provider": {"kind": "nope"}}, "provider"),
        ({"prompt": "hello"}, "definition"),
        ({"description": "on\u0000call"}, "description"),  # was a 503: the database refused it
    ],
)
def test_a_bad_agent_is_a_400_naming_the_field_and_stores_nothing(api, definition, field):
    good = {"provider": {"kind": "scripted", "turns": [{"content": "ok"}]}, "tools": []}
    define(api, "kept", **good)

    created = api.post("/api/agents/", {"name": "bad", **good, **definition}, format="json")
    changed = api.patch("/api/agents/kept/", definition, format="json")

    for answer in (created, changed):
        assert answer.status_code == 400, answer.json()
        assert field in answer.json()["errors"], answer.json()
        assert answer.json()["detail"].startswith(f"{field}:"), answer.json()
    assert list(Agent.objects.values_list("name", flat=True)) == ["kept"]
    assert AgentVersion.objects.count() == 1


def test_a_start_by_agent_that_cannot_run_is_a_400_naming_the_field_and_stores_nothing(
    api, settings
):
    define(
        api,
        "capped",
        provider={"kind": "scripted", "turns": [{"content": "ok"}], "max_tokens": 100},
        max_total_tokens=1000,
    )
    # A version that leaves the cost limit blank takes the deployment's:
    # a start may lower that one too, never raise it.
    settings.NRLLM_RUN_MAX_COST = Decimal("2")
    ModelPrice.objects.create(
        provider="scripted", model="scripted", input_per_million=1, output_per_million=1
    )
    refusals = [
        ("agent", {"agent": "nobody", "input": "x"}),
        ("agent", {"agent": "cap\u0000ped", "input": "x"}),  # was a 503
        ("version", {"agent": "capped", "version": 7, "input": "x"}),
        ("input", {"agent": "capped", "input": ""}),
        ("max_total_tokens", {"agent": "capped", "input": "x", "max_total_tokens": 5000}),
        # No room for the first call's largest cost (its prompt and 100).
        ("max_total_tokens", {"agent": "capped", "input": "x", "max_total_tokens": 10}),
        ("max_cost", {"agent": "capped", "input": "x", "max_cost": "1000000"}),
        ("request", {"agent": "capped", "input": "x", "tools": ["read_note"]}),
    ]
    for field, body in refusals:
        answer = api.post("/api/runs/", body, format="json")
        assert answer.status_code == 400, (field, answer.json())
        assert answer.json()["detail"].startswith(f"{field}:"), answer.json()
    assert not AgentRun.objects.exists()

    lowered = api.post(
        "/api/runs/", {"agent": "capped", "input": "x", "max_total_tokens": 500}, format="json"
    )
    assert lowered.status_code == 201
    assert lowered.json()["request"]["max_total_tokens"] == 500
    cheaper = {"agent": "capped", "input": "x", "max_cost": "0.5"}
    assert api.post("/api/runs/", cheaper, format="json").json()["request"]["max_cost"] == "0.5"


def test_two_changes_at_once_each_make_a_version_and_neither_undoes_the_other(
    api, operator, api_token
):
    """A PATCH keeps the fields it leaves out as the latest version has them
    when it saves, not as they were when it read them: one that waited on
    the agent's row lock while another change committed keeps that change."""
    define(api, "racy", provider=SCRIPTED, instructions="v1")
    editor = APIClient()
    editor.credentials(HTTP_AUTHORIZATION=api_token(operator))
    holding, commit, answers = threading.Event(), threading.Event(), {}

    def other_editor():  # holds the row lock, then saves its change over it
        try:
            with transaction.atomic():
                Agent.objects.select_for_update().get(name="racy")
                holding.set()
                commit.wait(timeout=30)
                save_agent("racy", {"provider": SCRIPTED, "instructions": "v2"}, create=False)
        finally:
            connection.close()

    def patch_tools():
        answers["patch"] = editor.patch("/api/agents/racy/", {"tools": TOOLS}, format="json")
        connection.close()

    first = threading.Thread(target=other_editor)
    first.start()
    assert holding.wait(timeout=30)
    second = threading.Thread(target=patch_tools)
    second.start()
    wait_until(lambda: _waiting_on_a_lock(), what="the PATCH waiting on the row lock")
    commit.set()
    first.join(timeout=30)
    second.join(timeout=30)

    assert answers["patch"].status_code == 200, answers["patch"].json()
    versions = AgentVersion.objects.filter(agent__name="racy").order_by("number")
    assert [(v.number, v.instructions, v.tools) for v in versions] == [
        (1, "v1", []),
        (2, "v2", []),
        (3, "v2", TOOLS),  # the PATCH on version 2, not on the version 1 it first read
    ]


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        return cursor.fetchone()[0] > 0


def test_every_change_is_a_new_version_and_an_admin_log_entry(api, viewer, api_token):
    from django.contrib.admin.models import LogEntry
    from rest_framework.test import APIClient

    define(api, "writer", provider={"kind": "scripted", "turns": [{"content": "a"}]})
    same = api.patch("/api/agents/writer/", {"description": "writes"}, format="json")
    assert same.json()["new_version"] is False
    changed = api.patch("/api/agents/writer/", {"instructions": "Be brief."}, format="json")
    assert changed.json()["new_version"] is True

    versions = api.get("/api/agents/writer/versions/").json()
    assert [(v["number"], v["instructions"]) for v in versions] == [(2, "Be brief."), (1, "")]
    assert api.get("/api/agents/writer/versions/1/").json()["instructions"] == ""
    messages = list(LogEntry.objects.order_by("pk").values_list("change_message", flat=True))
    assert messages == [
        "created writer: version 1",
        "description of writer changed; v1",
        "changed writer: version 2",
    ]
    # Viewing is a permission of its own; changing another.
    as_viewer = APIClient()
    as_viewer.credentials(HTTP_AUTHORIZATION=api_token(viewer))
    assert as_viewer.get("/api/agents/writer/").json()["latest"]["number"] == 2
    refused = as_viewer.patch("/api/agents/writer/", {"instructions": "x"}, format="json")
    assert refused.status_code == 403, refused.json()
    assert "agents.change_agent" in refused.json()["detail"]
