"""Schemathesis against our own OpenAPI schema: generated requests to every
endpoint find no 5xx and no response that the schema does not describe;
the approvals' endpoints again with a call and a question that wait and a
call decided, so that their answers carry real requests and their ids name
real ones; the
dead letters' with letters in the list, open and dismissed."""

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from nrllm_ops.wsgi import application
from runs import transitions
from runs.approvals import actions as approval_actions
from runs.models import AgentRun, ApprovalRequest, DeadLetter
from runs.models.vocabulary import SubmittedVia
from runs.operators import actions as operator_actions
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from tests.approval_requests import PLAN, TOOLS
from tests.drifting_model import request_for
from tests.helpers import answer, later, scripted, stored

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)
FUZZED = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(autouse=True)
def each_operation_has_a_node_id_of_its_own(request):
    """xdist runs items by node id: one shared by several operations' items
    ran one of them (``conftest.pytest_collection_modifyitems``)."""
    label = getattr(request.node, "operation_label", None)
    if label is not None:
        assert request.node.nodeid.endswith(f"[{label}]"), request.node.nodeid


@pytest.fixture
def keep_test_connection():
    """Calls go straight to the WSGI app, whose request signals would close
    the test's database connection; Django's test client disconnects them too."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def authorization(operator, api_token, settings, keep_test_connection):
    from django.contrib.auth.models import Permission

    operator.user_permissions.add(Permission.objects.get(codename="add_agentrun"))
    settings.NRLLM_API_THROTTLE_RATE = "100000/minute"
    return api_token(operator)


@pytest.mark.slow
@pytest.mark.django_db
@schema.parametrize()
@FUZZED
def test_the_api_keeps_to_its_schema(case, authorization):
    case.call_and_validate(headers={"Authorization": authorization}, checks=CHECKS)


#: A question the scripted model asks, with the shape its answer must have.
ASKING = [
    {
        "calls": [
            {
                "name": "ask_person",
                "arguments": {
                    "question": "which host?",
                    "answer_schema": {"type": "object", "required": ["host"]},
                },
            }
        ]
    },
    {"answer": "asked"},
]
#: The approvals' endpoints, and the run detail that lists a run's pending ones.
approvals_schema = schema.include(path_regex=r"^/api/(approvals/|runs/\{id\}/$)")


@pytest.fixture
def approvals_to_decide(operator, approvals, django_capture_on_commit_callbacks):
    """A run that waits for a call submitted through the API, one that
    waits for the answer to its question, and a call denied: the runs
    execute inline at the captured commits."""
    with django_capture_on_commit_callbacks(execute=True):
        waiting = enqueue(
            request_for("scripted", PLAN, TOOLS),
            submitted_by=operator,
            submitted_via=SubmittedVia.API,
        )
    with django_capture_on_commit_callbacks(execute=True):
        asking = enqueue(request_for("scripted", ASKING, ["ask_person"]))
    with django_capture_on_commit_callbacks(execute=True):
        denied_run = enqueue(request_for("scripted", PLAN, TOOLS))
    denied = ApprovalRequest.objects.get(run=denied_run)
    with django_capture_on_commit_callbacks(execute=True):
        assert approval_actions.deny(denied, operator, digest=denied.digest, note="no").ok
    return {
        "runs": [waiting.pk, asking.pk],
        "ids": [
            ApprovalRequest.objects.get(run=waiting).pk,
            ApprovalRequest.objects.get(run=asking).pk,
            denied.pk,
        ],
    }


@pytest.mark.slow
@pytest.mark.django_db
@approvals_schema.parametrize()
@FUZZED
def test_the_approvals_api_keeps_to_its_schema_with_calls_waiting(
    case, authorization, approvals_to_decide
):
    """Three of four generated integer ids are replaced by a real request's
    (the pending call, the pending question, the decided call); the rest,
    and every malformed id, stay as generated. No generated digest is the
    real one, so no decision, edit or answer goes through: each is refused
    (400, 404 or 409) without a 500."""
    generated = case.path_parameters.get("id")
    if case.operation.path == "/api/runs/{id}/":
        runs = approvals_to_decide["runs"]
        case.path_parameters["id"] = str(runs[len(str(generated)) % len(runs)])
    elif isinstance(generated, int) and not isinstance(generated, bool) and generated % 4 < 3:
        case.path_parameters["id"] = approvals_to_decide["ids"][generated % 4]
    case.call_and_validate(headers={"Authorization": authorization}, checks=CHECKS)
    assert ApprovalRequest.objects.filter(status="pending").count() == 2


#: The tools' endpoints, with MCP tools in the list.
tools_schema = schema.include(path_regex=r"^/api/tools/")


@pytest.mark.slow
@pytest.mark.django_db
@tools_schema.parametrize()
@FUZZED
def test_the_tools_api_keeps_to_its_schema_with_mcp_tools(case, authorization, tracker):
    """The real tracker server's tools (declared, undeclared, flagged) in
    the answers; a name of one of them in half the generated paths."""
    if "name" in case.path_parameters and len(case.path_parameters["name"]) % 2:
        case.path_parameters["name"] = "tracker__label_issue"
    case.call_and_validate(headers={"Authorization": authorization}, checks=CHECKS)


#: The dead letters' list.
dead_letters_schema = schema.include(path_regex=r"^/api/dead-letters/$")


@pytest.fixture
def dead_letters(operator, django_capture_on_commit_callbacks):
    """An open dead letter with no failure class (the reaper's, for a write
    interrupted) and none resolved by anyone; one dismissed, with a class."""
    interrupted = transitions.create_queued_run(stored(scripted(answer())), "p")
    lease = transitions.claim(interrupted.pk, "dead-worker", 60).lease
    assert transitions.renew_lease(lease, 60, fence="non_idempotent_write")
    reap_stale_runs(as_of=later())
    with django_capture_on_commit_callbacks(execute=True):
        refused = enqueue(scripted({"error": "auth"}))
    dismissed = DeadLetter.objects.get(run=refused)
    assert operator_actions.dismiss(dismissed, operator, "seen").ok
    letters = {letter.run_id: letter for letter in DeadLetter.objects.all()}
    blank = letters[interrupted.pk]
    assert (blank.failure_class, blank.resolution, blank.resolved_by) == ("", "", None)
    assert letters[refused.pk].failure_class == "auth"


@pytest.mark.slow
@pytest.mark.django_db
@dead_letters_schema.parametrize()
@FUZZED
def test_the_dead_letters_api_keeps_to_its_schema_with_a_letter_of_no_class(
    case, authorization, dead_letters
):
    """A generated query of an odd number of parameters is sent without
    them, so many calls list both letters whatever filters hypothesis tries."""
    if len(case.query or {}) % 2:
        case.query = {}
    case.call_and_validate(headers={"Authorization": authorization}, checks=CHECKS)


#: What recorded turns spent, and a run that carries its cost and tokens.
usage_schema = schema.include(path_regex=r"^/api/(usage/|runs/\{id\}/$)")


@pytest.fixture
def spend(operator):
    """Spend today by the operator (priced) and from the command line (one
    turn unpriced), and a run whose cost is unknown."""
    from spend.budgets import database_now
    from spend.models import DailySpend

    today = database_now().date()
    DailySpend.objects.create(
        day=today,
        submitter=operator.pk,
        provider="openai",
        model="gpt-x",
        turns=2,
        input_tokens=30,
        output_tokens=12,
        cost="0.0012",
    )
    DailySpend.objects.create(
        day=today,
        submitter=0,
        provider="scripted",
        model="scripted",
        turns=1,
        input_tokens=11,
        output_tokens=7,
        unpriced_turns=1,
    )
    unknown = transitions.create_queued_run(stored(scripted(answer())), "p")
    AgentRun.objects.filter(pk=unknown.pk).update(prompt_tokens=11, unpriced_turns=1)
    return unknown.pk


@pytest.mark.slow
@pytest.mark.django_db
@usage_schema.parametrize()
@FUZZED
def test_the_usage_api_and_a_runs_cost_keep_to_the_schema_with_spend_recorded(
    case, authorization, spend
):
    """Half the generated queries are sent without their parameters, so
    many calls list today's spend whatever hypothesis tries."""
    if case.operation.path == "/api/runs/{id}/":
        case.path_parameters["id"] = str(spend)
    elif len(case.query or {}) % 2:
        case.query = {"group_by": "user"}
    case.call_and_validate(headers={"Authorization": authorization}, checks=CHECKS)
