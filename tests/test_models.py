"""The stored vocabulary matches the Python enums; steps are append-only in the database."""

import pytest
from django.db import DatabaseError, transaction

from runs.models import AgentRun, DeadLetter, RunStep
from runs.runtime import run
from runs.vocabulary import (
    DeadLetterReason,
    FailureClass,
    RunMode,
    RunStatus,
    StepKind,
    TerminationReason,
)
from tests.helpers import answer, scripted
from tools.effects import ToolEffect


def choices(model, field):
    return [value for value, _ in model._meta.get_field(field).choices]


def test_database_choices_match_the_enums():
    assert (
        choices(AgentRun, "status")
        == [
            "queued",
            "running",
            "completed",
            "failed",
            "cancelled",
        ]
        == list(RunStatus.values)
    )
    assert choices(AgentRun, "termination_reason") == list(TerminationReason.values)
    assert (
        choices(AgentRun, "failure_class")
        == list(FailureClass.values)
        == [
            "connection",
            "rate_limit",
            "auth",
            "configuration",
            "client_error",
            "server_error",
            "circuit_open",
            "unknown",
        ]
    )
    assert choices(AgentRun, "mode") == list(RunMode.values) == ["queued", "interactive"]
    assert choices(AgentRun, "pending_effect") == [e.value for e in ToolEffect]
    assert choices(RunStep, "effect") == [e.value for e in ToolEffect]
    assert choices(RunStep, "kind") == list(StepKind.values)
    assert choices(DeadLetter, "reason") == list(DeadLetterReason.values)


@pytest.mark.django_db
def test_the_database_refuses_to_update_a_step():
    agent_run = run(scripted(answer("x")))
    step = agent_run.steps.first()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        RunStep.objects.filter(pk=step.pk).update(error="rewritten")
    assert RunStep.objects.get(pk=step.pk).error == ""
