"""The OpenAPI 3.1 schema as an integrator reads it (#47): a run's
``request`` is typed by the runtime's own request schema (not "any"), and
the run-ended webhook is under ``webhooks``, its body field for field as
the runtime delivers it."""

import copy
import json

import pytest
from jsonschema import Draft202012Validator
from rest_framework.test import APIClient

from agents.starting import enqueue as enqueue_start
from agents.versions import save_agent
from runs.approvals import actions as approval_actions
from runs.models import AgentRun, ApprovalRequest
from runs.providers import PROVIDER_KINDS
from runs.runtime import enqueue
from runs.runtime.run_request import request_json_schema
from spend.models import ModelPrice
from tests.helpers import answer, call, scripted

pytestmark = pytest.mark.django_db(transaction=True)


def schema() -> dict:
    response = APIClient().get("/api/schema/?format=json")
    assert response.status_code == 200
    return response.json()


def validator(document: dict, component: dict) -> Draft202012Validator:
    """A validator of ``component`` (a schema of ``document``, whose refs
    point into its components), as OpenAPI 3.1 reads it: JSON Schema 2020-12."""
    return Draft202012Validator({**component, "components": document["components"]})


def test_a_runs_request_is_typed_by_the_runtimes_own_request_schema(api):
    document = schema()
    components = document["components"]["schemas"]
    field = components["Run"]["properties"]["request"]
    assert field["allOf"] == [{"$ref": "#/components/schemas/RunRequest"}], field
    stored = request_json_schema(stored=True)
    typed = components["RunRequest"]
    assert set(typed["properties"]) == set(stored["properties"])
    assert (typed["required"], typed["additionalProperties"]) == (stored["required"], False)
    kinds = [one["properties"]["kind"]["const"] for one in typed["properties"]["provider"]["oneOf"]]
    assert sorted(kinds) == sorted(PROVIDER_KINDS)
    # The whole request a POST may give: the same fields, the limits among
    # them, and the team it starts in (G22), which the run keeps as its own.
    body = components["RunRequestRequest"]
    assert set(body["properties"]) == set(stored["properties"]) | {"team"}
    assert body["required"] == [
        "prompt",
        "provider",
    ]
    assert {"max_total_tokens", "max_cost", "require_approval"} <= set(body["properties"])

    limited = {
        **scripted({"content": "ok", "usage": {"prompt_tokens": 3, "completion_tokens": 2}}),
        "max_total_tokens": 5_000,
        "instructions": "be brief",
    }
    created = api.post("/api/runs/", limited, format="json")
    assert created.status_code == 201, created.content
    request = created.json()["request"]
    assert request["max_total_tokens"] == 5_000
    assert list(validator(document, typed).iter_errors(request)) == []
    wrong = {**request, "provider": {"kind": "scripted", "turns": []}}
    assert list(validator(document, typed).iter_errors(wrong)), "an empty script is refused"


def exactly(components: dict) -> dict:
    """``components`` with every run-ended object closed to other keys, so
    a body that has more than the schema says fails to validate."""
    closed = copy.deepcopy(components)
    for name, component in closed["schemas"].items():
        if name.startswith("RunEnded") and "properties" in component:
            assert set(component["required"]) == set(component["properties"]), name
            component["additionalProperties"] = False
    return closed


def test_the_run_ended_webhook_in_the_schema_is_the_body_delivered_field_for_field(
    receiver,  # noqa: F811 (the fixture imported above)
    operator,
    approvals,
):
    receiver.start()
    hook = receiver.url()
    # Before any price: a turn of unknown cost, the body's cost null.
    usage = {"prompt_tokens": 420, "completion_tokens": 85}
    notify = {**call("send_notification", recipient="team", message="v2"), "usage": usage}
    notified = scripted(notify, answer("sent"), tools=["send_notification"])
    waiting = enqueue({**notified, "webhook": hook})
    (approval,) = ApprovalRequest.objects.filter(run=waiting)
    assert approval_actions.deny(approval, operator, digest=approval.digest, note="no").ok
    dead = enqueue({**scripted({"error": "auth"}), "webhook": hook})
    ModelPrice.objects.create(
        provider="scripted", model="scripted", input_per_million=1, output_per_million=1
    )
    definition = {**scripted({"content": "Told the team.", "usage": usage}), "webhook": hook}
    del definition["prompt"]
    save_agent("on-call", definition, user=operator, create=True)
    by_agent = enqueue_start({"agent": "on-call", "input": "Tell the team."})
    assert [AgentRun.objects.get(pk=run.pk).status for run in (waiting, dead, by_agent)] == [
        "completed",
        "failed",
        "completed",
    ]

    document = schema()
    assert document["openapi"].startswith("3.1")
    (operation,) = document["webhooks"]["run-ended"].values()
    body_schema = operation["requestBody"]["content"]["application/json"]["schema"]
    checker = validator({**document, "components": exactly(document["components"])}, body_schema)
    seen = set()
    for _, body in receiver.posts:
        event = json.loads(body)
        assert list(checker.iter_errors(event)) == [], event
        run = event["run"]
        seen.add((event["event"], run["agent"] is None, run["cost"] is None, run["dead_lettered"]))
    assert {
        ("run.waiting_for_approval", True, True, False),  # a turn of no price: cost null
        ("run.completed", True, True, False),  # after the denial
        ("run.failed", True, False, True),  # dead-lettered before any turn
        ("run.completed", False, False, False),  # an agent's, priced
    } == seen, seen
    # Something the body does not hold fails: the check is not vacuous.
    assert list(checker.iter_errors({**event, "extra": 1}))
    assert list(checker.iter_errors({**event, "run": {**event["run"], "tokens": {}}}))
