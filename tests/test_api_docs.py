"""The API's documentation as an integrator reads it (#30): every operation
says what it does, and the example of a run works against the demo."""

import pytest
from django.core.management import call_command

from runs.models import AgentRun
from tools.models import OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)


def test_every_operation_is_described_and_the_run_example_works_against_the_demo(api):
    schema = api.get("/api/schema/?format=json").json()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            description = operation.get("description", "")
            # A view without a docstring of its own showed a mixin's.
            assert description and "oversized body" not in description, (method, path)

    call_command("seed_demo", verbosity=0)
    notified = set(OutboxNotification.objects.values_list("pk", flat=True))
    body = schema["paths"]["/api/runs/"]["post"]["requestBody"]["content"]["application/json"]
    # A whole request, and a start of one of the demo's agents by name.
    examples = [each["value"] for each in body["examples"].values() if "value" in each]
    assert [("agent" in example) for example in examples] == [True, False]
    for example in examples:
        response = api.post("/api/runs/", example, format="json")
        assert response.status_code == 201, response.content
        agent_run = AgentRun.objects.get(pk=response.json()["id"])
        assert agent_run.status == "completed", agent_run.error_message
        read = agent_run.steps.get(tool_name="read_note")
        assert read.result["slug"] == "release-notes" and read.result["body"], read.result
        (sent,) = OutboxNotification.objects.exclude(pk__in=notified).filter(run_id=agent_run.pk)
        assert sent.recipient == ("ops@example.org" if "agent" in example else "team")
