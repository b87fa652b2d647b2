"""`make run`'s set-up commands: the admin account and demo data from real executions."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db.models.functions import Now

from runs.dispatch import executing_in_embedded_worker
from runs.embedded_worker import execute_due_runs
from runs.models import AgentRun, DeadLetter
from tools.models import OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)


def test_seed_demo_executes_the_five_scenarios_once():
    call_command("seed_demo", stdout=io.StringIO())
    # One run's retry waits its backoff; once it is due (the wait skipped by
    # back-dating it), the embedded worker's pass executes it.
    backing_off = AgentRun.objects.filter(status="queued", requeue_count=1)
    assert backing_off.filter(available_at__gt=Now()).count() == 1
    backing_off.update(available_at=Now())
    with executing_in_embedded_worker():
        assert execute_due_runs(limit=10) == 1
    runs = {run.prompt: run for run in AgentRun.objects.all()}
    assert len(runs) == 5
    by_outcome = sorted(
        (run.status, run.termination_reason, run.error_type, run.requeue_count)
        for run in runs.values()
    )
    assert by_outcome == [
        ("cancelled", "cancelled", "", 0),
        ("completed", "completed", "", 0),
        ("completed", "completed", "", 1),
        ("failed", "not_retryable", "AuditPersistenceFailed", 0),
        ("failed", "not_retryable", "ProviderError", 0),
    ]
    assert DeadLetter.objects.get().run.failure_class == "auth"
    audit_failed = AgentRun.objects.get(error_type="AuditPersistenceFailed")
    assert audit_failed.pending_effect == "non_idempotent_write"
    # One each from the completed, the audit-failed and the resumed run.
    assert OutboxNotification.objects.count() == 3
    # The fault injected for the demo is gone.
    for completed in AgentRun.objects.filter(status="completed"):
        assert completed.steps.filter(tool_name="send_notification").count() == 1
    resumed = AgentRun.objects.get(requeue_count=1)
    assert resumed.steps.filter(kind="resume").count() == 1

    out = io.StringIO()
    call_command("seed_demo", stdout=out)
    assert "not seeded again" in out.getvalue() and AgentRun.objects.count() == 5


def test_ensure_admin_uses_the_given_password_once(monkeypatch):
    monkeypatch.setenv("NRLLM_ADMIN_PASSWORD", "s3cret-pass")
    call_command("ensure_admin", stdout=io.StringIO())
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password("s3cret-pass")
    monkeypatch.setenv("NRLLM_ADMIN_PASSWORD", "other")
    call_command("ensure_admin", stdout=io.StringIO())
    admin.refresh_from_db()
    assert admin.check_password("s3cret-pass")


def test_ensure_admin_generates_and_prints_a_password(monkeypatch):
    monkeypatch.delenv("NRLLM_ADMIN_PASSWORD", raising=False)
    out = io.StringIO()
    call_command("ensure_admin", stdout=out)
    password = out.getvalue().rsplit(": ", 1)[1].strip()
    assert get_user_model().objects.get(username="admin").check_password(password)
