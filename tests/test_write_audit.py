"""G2 and G3: a write whose step cannot be persisted fails the run, and is
never retried; read-only runs stay fail-soft. The fault is a real database
trigger refusing the INSERT."""

import os

import pytest
from django.db import OperationalError, connection

from runs.models import DeadLetter, RunStep
from runs.models.faults import step_inserts_refused
from runs.providers.failures import classify
from runs.runtime import enqueue, run
from runs.runtime.errors import AuditPersistenceFailed
from tests.helpers import answer, call, scripted
from tools.models import Note, OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)

NOTIFY = call("send_notification", recipient="ops", message="deployed")


def test_a_read_only_run_survives_a_refused_step_insert():
    Note.objects.create(slug="a", body="b")
    with step_inserts_refused("read_note"):
        agent_run = run(
            scripted(call("read_note", slug="a"), answer("read it"), tools=["read_note"])
        )
    assert (agent_run.status, agent_run.output) == ("completed", "read it")
    # The refused step waits to be written ahead of the next one, which the
    # database refuses with it: the journal stays a prefix, without a gap.
    assert list(agent_run.steps.values_list("kind", flat=True)) == ["request", "llm"]


def test_a_non_tool_step_refused_is_fail_soft_too():
    with step_inserts_refused():
        agent_run = run(scripted(answer("ok")))
    assert agent_run.status == "completed" and agent_run.steps.count() == 0


def test_an_interactive_write_fails_closed_when_its_step_is_refused():
    with step_inserts_refused("send_notification"):
        agent_run = run(scripted(NOTIFY, answer("never reached"), tools=["send_notification"]))
    assert (agent_run.status, agent_run.termination_reason, agent_run.failure_class) == (
        "failed",
        "not_retryable",
        "unknown",
    )
    assert agent_run.error_type == "AuditPersistenceFailed"
    assert "send_notification" in agent_run.error_message
    # The write happened once and its fence still stands: a write in doubt.
    assert OutboxNotification.objects.count() == 1
    assert agent_run.pending_effect == "non_idempotent_write"
    # Nothing after the unrecorded write: the final answer was never asked for.
    assert list(agent_run.steps.values_list("kind", flat=True)) == ["request", "llm"]


def test_a_queued_write_is_dead_lettered_not_retryable_with_budget_left(settings):
    settings.NRLLM_MAX_REQUEUES = 3
    with step_inserts_refused("send_notification"):
        agent_run = enqueue(scripted(NOTIFY, answer(), tools=["send_notification"]))
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason) == ("failed", "not_retryable")
    assert agent_run.requeue_count == 0 and agent_run.lease_token == 1
    dead_letter = DeadLetter.objects.get(run=agent_run)
    assert (dead_letter.reason, dead_letter.failure_class, dead_letter.error_type) == (
        "not_retryable",
        "unknown",
        "AuditPersistenceFailed",
    )
    assert OutboxNotification.objects.count() == 1


def test_an_idempotent_write_fails_closed_too():
    with step_inserts_refused("upsert_note"):
        agent_run = run(
            scripted(call("upsert_note", slug="a", body="b"), answer(), tools=["upsert_note"])
        )
    assert agent_run.status == "failed" and agent_run.error_type == "AuditPersistenceFailed"
    assert agent_run.pending_effect == "idempotent_write"


def test_audit_failure_is_unknown_even_when_caused_by_a_connection_error():
    try:
        try:
            raise OperationalError("server closed the connection")
        except OperationalError as cause:
            raise AuditPersistenceFailed("write not recorded") from cause
    except AuditPersistenceFailed as error:
        assert classify(error) == "unknown"


@pytest.mark.worker
def test_a_worker_dead_letters_a_write_whose_step_is_refused_and_never_retries_it(workers, queue):
    agent_run = enqueue(scripted(NOTIFY, answer(), tools=["send_notification"]))
    with step_inserts_refused("send_notification"):
        workers.run_burst()
    # A duplicate wake-up and another worker later change nothing.
    queue.enqueue("runs.jobs.execute_run_job", str(agent_run.pk))
    workers.run_burst()

    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason, agent_run.error_type) == (
        "failed",
        "not_retryable",
        "AuditPersistenceFailed",
    )
    assert agent_run.lease_token == 1 and agent_run.requeue_count == 0
    assert OutboxNotification.objects.count() == 1
    assert DeadLetter.objects.filter(run=agent_run).count() == 1
    # The job function never raises for a run's outcome: RQ saw no failure.
    assert queue.failed_job_registry.count == 0


@pytest.fixture
def role_without_step_insert(worker_env):
    """A database role with every privilege the app needs except INSERT on steps."""
    role = f"nrllm_no_step_insert_{os.environ.get('PYTEST_XDIST_WORKER', 'gw0')}"
    database = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f"DROP ROLE IF EXISTS {role}")
        cursor.execute(f"CREATE ROLE {role} LOGIN")
        cursor.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        cursor.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
        cursor.execute(f"REVOKE INSERT ON {RunStep._meta.db_table} FROM {role}")
    db = connection.settings_dict
    yield f"postgres://{role}@{db['HOST']}:{db['PORT']}/{database}"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP OWNED BY {role}")
        cursor.execute(f"DROP ROLE {role}")


@pytest.mark.worker
def test_a_worker_denied_step_inserts_never_starts_a_write_and_finishes_reads(
    workers, role_without_step_insert
):
    Note.objects.create(slug="a", body="b")
    read = enqueue(scripted(call("read_note", slug="a"), answer("read"), tools=["read_note"]))
    write = enqueue(
        scripted(call("upsert_note", slug="a", body="c"), answer(), tools=["upsert_note"])
    )
    workers.run_burst(DATABASE_URL=role_without_step_insert)

    read.refresh_from_db()
    write.refresh_from_db()
    assert (read.status, read.output, read.steps.count()) == ("completed", "read", 0)
    # The model turn that asked for the write could not be recorded: the write
    # does not start (G12), and the attempt is retried (no write ran).
    assert (write.status, write.failure_class, write.error_type) == (
        "queued",
        "connection",
        "StepsNotDurable",
    )
    assert write.pending_effect == "" and write.requeue_count == 1
    assert Note.objects.get(slug="a").body == "b"
