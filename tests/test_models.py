"""The stored vocabulary matches the Python enums; steps are append-only in the database."""

import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from api.models import RunCreationKey
from runs.models import AgentRun, ApprovalRequest, DeadLetter, RunStep
from runs.models.vocabulary import (
    ApprovalStatus,
    DeadLetterReason,
    FailureClass,
    RunMode,
    RunStatus,
    StepKind,
    SubmittedVia,
    TerminationReason,
    WaitKind,
)
from runs.reaper.retention import delete_whole_runs
from runs.runtime import run
from runs.transitions.run_insert import create_queued_run as insert_queued_run
from tests.helpers import answer, call, scripted
from tools.effects import ToolEffect


def choices(model, field):
    return [value for value, _ in model._meta.get_field(field).choices]


def test_database_choices_match_the_enums():
    assert (
        choices(AgentRun, "status")
        == [
            "queued",
            "running",
            "waiting_for_approval",
            "waiting_for_input",
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
    assert choices(ApprovalRequest, "status") == list(ApprovalStatus.values)
    assert choices(ApprovalRequest, "kind") == list(WaitKind.values)
    assert choices(AgentRun, "submitted_via") == list(SubmittedVia.values)


@pytest.mark.django_db
def test_the_database_refuses_to_update_a_step():
    agent_run = run(scripted(answer("x")))
    step = agent_run.steps.first()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        RunStep.objects.filter(pk=step.pk).update(error="rewritten")
    assert RunStep.objects.get(pk=step.pk).error == ""


@pytest.mark.django_db(transaction=True)  # the deferred foreign keys are checked at a real commit
def test_a_step_is_deleted_only_with_its_whole_run():
    """G11's one exception: a whole run goes with everything that belongs to
    it (retention); no statement takes a step out of a run that stays. (The
    test's own flush truncates every table in one statement: allowed.)"""
    agent_run = run(scripted(call("search_notes", query="x"), answer("x"), tools=["search_notes"]))
    kept = run(scripted(answer("kept")))
    user = get_user_model().objects.create_user("ida")
    # Everything that holds the run goes with it, hidden relations too.
    RunCreationKey.objects.create(user=user, key="k", body_sha256="0" * 64, run=agent_run)
    DeadLetter.objects.create(run=agent_run, reason="not_retryable")
    step = agent_run.steps.first()
    with pytest.raises(DatabaseError, match="append-only; DELETE refused"), transaction.atomic():
        RunStep.objects.filter(pk=step.pk).delete()
    with pytest.raises(DatabaseError, match="append-only; DELETE refused"), transaction.atomic():
        agent_run.delete()  # Django's delete takes the steps first
    with pytest.raises(DatabaseError, match="TRUNCATE refused"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {RunStep._meta.db_table}")
    assert RunStep.objects.filter(run=agent_run).count() == 4

    assert delete_whole_runs([agent_run.pk]) == 1
    assert not AgentRun.objects.filter(pk=agent_run.pk).exists()
    assert not RunStep.objects.filter(run_id=agent_run.pk).exists()
    assert not RunCreationKey.objects.exists() and not DeadLetter.objects.exists()
    assert kept.steps.count() == 2


# What recording a read step changes on the run (runs/transitions/step_journal.py).
RENEWAL_COLUMNS = (
    "step_count",
    "lease_expires_at",
    "prompt_tokens",
    "completion_tokens",
    "llm_latency_ms",
    "pending_call",
)


@pytest.mark.django_db
def test_no_index_holds_a_column_that_a_step_renewal_changes():
    # Then PostgreSQL can write the renewal as a heap-only (HOT) update,
    # without a new entry in each of the run table's indexes.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s",
            [AgentRun._meta.db_table],
        )
        indexes = cursor.fetchall()
    assert len(indexes) > 5
    for name, definition in indexes:
        assert not [column for column in RENEWAL_COLUMNS if column in definition], name


@pytest.mark.django_db(transaction=True)
def test_recording_read_steps_leaves_the_run_indexes_alone():
    # Each run's steps go on its row by heap-only updates: the status index
    # gains entries for the claim and the settle only, not for each step.
    from runs.runtime import enqueue
    from tests.helpers import call

    def index_tuples():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = %s",
                [AgentRun._meta.db_table],
            )
            return cursor.fetchone()

    before = index_tuples()
    enqueue(scripted(*[call("read_note", slug="x")] * 10, answer(), tools=["read_note"]))
    (updates_after, hot_after), (updates_before, hot_before) = index_tuples(), before
    # The claim, 10 llm turns and 10 tool steps, the finish: 22 updates, of
    # which the 20 step records can be heap-only (most, if a page fills up).
    assert updates_after - updates_before == 22
    assert hot_after - hot_before >= 10


def test_a_queued_run_inserted_in_one_statement_is_the_row_the_orm_would_insert(operator):
    """``runs.transitions.run_insert`` builds its INSERT from the model: the row it
    stores, and the instance it returns, match the ORM's ``create`` in every
    column but the run's id and times."""
    request = {"prompt": "p", "tools": [], "provider": {"kind": "scripted"}, "max_iterations": 3}
    via = SubmittedVia.API
    by_orm = AgentRun.objects.create(
        request=request,
        prompt="p",
        status=RunStatus.QUEUED,
        mode=RunMode.QUEUED,
        submitted_by=operator,
        submitted_via=via,
        available_at=timezone.now(),
    )
    returned = insert_queued_run(request, "p", submitted_by=operator, submitted_via=via)
    stored = AgentRun.objects.get(pk=returned.pk)
    times = {"id", "created_at", "available_at"}
    for field in AgentRun._meta.concrete_fields:
        if field.name in times:
            continue
        expected = getattr(by_orm, field.attname)
        assert getattr(stored, field.attname) == expected, field.name
        assert getattr(returned, field.attname) == expected, field.name
    assert returned.created_at == stored.created_at == stored.available_at
    assert not returned._state.adding
