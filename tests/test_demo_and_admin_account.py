"""`make run`'s set-up commands: the admin account and demo data from real
executions, and what they print: a line per demo run, then how to log in."""

import io
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db.models.functions import Now

from agents.management.commands import seed_demo
from runs.models import AgentRun, ApprovalRequest, DeadLetter
from runs.queue.dispatch import executing_in_embedded_worker
from runs.workers.embedded import execute_due_runs
from teams.models import Membership
from tools.models import OutboxNotification
from triggers.models import TriggerEvent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("required_for", ["non_idempotent_write", "write", "none"])
def test_seed_demo_executes_the_scenarios_once_in_two_teams(settings, required_for):
    # `make run` ships non_idempotent_write; the stories end the same under
    # every policy (the approval stories ask for their approval themselves).
    settings.NRLLM_APPROVAL_REQUIRED_FOR = required_for
    call_command("seed_demo", stdout=io.StringIO())
    # One run's retry waits its backoff; once it is due (the wait skipped by
    # back-dating it), the embedded worker's pass executes it.
    backing_off = AgentRun.objects.filter(status="queued", requeue_count=1)
    assert backing_off.filter(available_at__gt=Now()).count() == 1
    backing_off.update(available_at=Now())
    with executing_in_embedded_worker():
        assert execute_due_runs(limit=10) == 1
    # The twelve stories; Support's schedule and trigger started three more.
    stories = AgentRun.objects.filter(firing__isnull=True, trigger_event__isnull=True)
    runs = {run.prompt: run for run in stories}
    assert len(runs) == 12
    triggered = AgentRun.objects.exclude(pk__in=stories.values("pk"))
    assert sorted(
        (run.status, run.submitted_via, run.submitted_by.username, run.team.slug)
        for run in triggered
    ) == [("completed", "schedule", "sam", "support")] * 2 + [
        ("completed", "trigger", "sam", "support")
    ]
    # The alert was sent twice: one event, one run.
    assert TriggerEvent.objects.count() == 1
    by_outcome = sorted(
        (run.status, run.termination_reason, run.error_type, run.requeue_count)
        for run in runs.values()
    )
    assert by_outcome == [
        ("cancelled", "cancelled", "", 0),
        ("completed", "completed", "", 0),
        ("completed", "completed", "", 0),
        ("completed", "completed", "", 0),
        ("completed", "completed", "", 0),
        ("completed", "completed", "", 1),
        ("failed", "budget_exhausted", "BudgetExhausted", 0),
        ("failed", "not_retryable", "AuditPersistenceFailed", 0),
        ("failed", "not_retryable", "ProviderError", 0),
        ("waiting_for_approval", "", "", 0),
        ("waiting_for_approval", "", "", 0),
        ("waiting_for_input", "", "", 0),
    ]
    # The write in doubt is dead-lettered with the run that was not retryable.
    assert sorted(DeadLetter.objects.values_list("run__error_type", "failure_class")) == [
        ("AuditPersistenceFailed", "unknown"),
        ("BudgetExhausted", ""),
        ("ProviderError", "auth"),
    ]
    audit_failed = AgentRun.objects.get(error_type="AuditPersistenceFailed")
    assert audit_failed.pending_effect == "non_idempotent_write"
    # One each from the completed, the audit-failed, the resumed and the
    # approved run; none from the denied or the waiting one.
    assert OutboxNotification.objects.count() == 4
    # The fault injected for the demo is gone.
    for completed in AgentRun.objects.filter(status="completed", team__slug="ops"):
        assert completed.steps.filter(kind="tool", tool_name="send_notification").count() == 1
    resumed = AgentRun.objects.get(requeue_count=1)
    assert resumed.steps.filter(kind="resume").count() == 2  # after its approval, its retry
    assert OutboxNotification.objects.filter(run_id=resumed.pk).count() == 1

    # Three agents; three runs started from them, each keeping the version
    # it started from (on-call was changed after its run parked: version 2).
    started = stories.filter(agent_version__isnull=False)
    assert sorted((r.agent_version.agent.name, r.agent_version.number) for r in started) == [
        ("on-call", 1),
        ("release-notes", 1),
        ("triage", 1),
    ]
    # Two teams (G22): Support's one run, Operations' every other; three
    # members, one of them in both.
    assert sorted(stories.values_list("team__slug", flat=True)) == ["ops"] * 11 + ["support"]
    assert seeded(seed_demo.TRIAGE).submitted_by.username == "sam"
    assert set(Membership.objects.values_list("user__username", "team__slug").distinct()) >= {
        ("olga", "ops"),
        ("sam", "support"),
        ("pat", "ops"),
        ("pat", "support"),
    }
    assert seeded(seed_demo.WAITING).agent_version.agent.latest.number == 2
    assert (
        seeded(seed_demo.COMPLETED).request["instructions"]
        == (seed_demo.AGENTS["release-notes"][1])
    )

    out = io.StringIO()
    call_command("seed_demo", stdout=out)
    assert "not seeded again" in out.getvalue() and AgentRun.objects.count() == 15
    # The demo's model is priced: its runs' spend is known, and each run's is
    # the sum of its recorded turns.
    over_budget = seeded(seed_demo.OVER_BUDGET)
    assert (over_budget.total_tokens, over_budget.known_cost) == (1170, Decimal("0.004"))
    assert over_budget.steps.filter(kind="llm").count() == 2


def seeded(scenario: dict) -> AgentRun:
    """The demo's run of ``scenario`` (one of seed_demo's requests)."""
    return AgentRun.objects.get(prompt=scenario["prompt"])


def test_seed_demo_leaves_one_run_waiting_and_decides_one_each_way_as_the_demo_approver(
    approvals,
):
    out = io.StringIO()
    call_command("seed_demo", stdout=out)
    demo_approver = get_user_model().objects.get(username=seed_demo.DEMO_APPROVER)

    waiting = seeded(seed_demo.WAITING)
    assert waiting.status == "waiting_for_approval"
    (pending,) = waiting.approvals.all()
    assert (pending.status, pending.tool_name, pending.decided_by) == (
        "pending",
        "send_notification",
        None,
    )
    assert not waiting.steps.filter(kind="tool").exists()
    assert not OutboxNotification.objects.filter(run_id=waiting.pk).exists()

    approved = seeded(seed_demo.APPROVED)
    (approval,) = approved.approvals.all()
    assert (approval.status, approval.decided_by, approval.note) == (
        "approved",
        demo_approver,
        seed_demo.APPROVED_NOTE,
    )
    # Sent once: the approved call, with its idempotency key.
    (notification,) = OutboxNotification.objects.filter(run_id=approved.pk)
    assert notification.idempotency_key == approval.idempotency_key
    assert (approved.status, approved.output) == (
        "completed",
        seed_demo.APPROVED["provider"]["turns"][-1]["content"],
    )

    denied = seeded(seed_demo.DENIED)
    (denial,) = denied.approvals.all()
    assert (denial.status, denial.decided_by, denial.note) == (
        "denied",
        demo_approver,
        seed_demo.DENIED_NOTE,
    )
    assert not OutboxNotification.objects.filter(run_id=denied.pk).exists()
    # The model was told, note and all, and its next turn answered.
    told = denied.steps.get(kind="tool", tool_name="send_notification")
    assert "denied" in told.error and seed_demo.DENIED_NOTE in told.error
    assert (denied.status, denied.output) == (
        "completed",
        seed_demo.DENIED["provider"]["turns"][-1]["content"],
    )

    # The stories that are not about approval had theirs decided the same way.
    # One question waits for an answer; one edited call for its approval.
    asking = seeded(seed_demo.ASKING)
    (question,) = asking.approvals.all()
    assert (asking.status, question.kind, question.status) == (
        "waiting_for_input",
        "question",
        "pending",
    )
    edited = seeded(seed_demo.EDITED)
    replaced, edit = edited.approvals.order_by("pk")
    assert (replaced.status, edit.status, edit.replaces_id) == ("replaced", "pending", replaced.pk)
    assert (edit.arguments, edit.edited_by, edit.note) == (
        seed_demo.EDITED_ARGUMENTS,
        demo_approver,
        seed_demo.EDITED_NOTE,
    )
    routine = ApprovalRequest.objects.exclude(run__in=[waiting, approved, denied, asking, edited])
    assert sorted(routine.values_list("run__prompt", "status", "decided_by__username")) == sorted(
        (scenario["prompt"], "approved", seed_demo.DEMO_APPROVER)
        for scenario in (seed_demo.COMPLETED, seed_demo.AUDIT_FAILED, seed_demo.RESUMED)
    )
    # The summary names the new runs.
    summary = out.getvalue()
    for agent_run, words in [
        (waiting, "waits for approval"),
        (approved, "approved"),
        (denied, "denied"),
    ]:
        (line,) = [line for line in summary.splitlines() if line.startswith(str(agent_run.pk))]
        assert agent_run.status in line and words in line


def test_the_demo_approver_may_approve_writes_and_cannot_log_in(client):
    call_command("seed_demo", stdout=io.StringIO())
    demo_approver = get_user_model().objects.get(username=seed_demo.DEMO_APPROVER)
    assert not demo_approver.has_usable_password()
    assert not (demo_approver.is_staff or demo_approver.is_superuser)
    # Approver and runner in Operations (an approver releases only writes
    # they could make, G22), and nothing anywhere else.
    assert not demo_approver.user_permissions.exists()
    assert set(demo_approver.team_memberships.values_list("team__slug", "role")) == {
        ("ops", "approver"),
        ("ops", "runner"),
    }
    assert not client.login(username=seed_demo.DEMO_APPROVER, password="")


def test_ensure_admin_uses_the_given_password_once(monkeypatch):
    monkeypatch.setenv("NRLLM_ADMIN_PASSWORD", "s3cret-pass")
    out = io.StringIO()
    call_command("ensure_admin", stdout=out)
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password("s3cret-pass")
    assert "password:   the one NRLLM_ADMIN_PASSWORD gives" in out.getvalue()
    assert "s3cret-pass" not in out.getvalue()
    monkeypatch.setenv("NRLLM_ADMIN_PASSWORD", "other")
    out = io.StringIO()
    call_command("ensure_admin", stdout=out)
    admin.refresh_from_db()
    assert admin.check_password("s3cret-pass")
    # Given then, not now: the block cannot tell it from one changed since.
    assert "password:   the one set when the account was made or since" in out.getvalue()


def block_of(out: io.StringIO) -> str:
    """What ensure_admin printed, from its password line to the rule under it."""
    lines = out.getvalue().splitlines()
    start = next(at for at, line in enumerate(lines) if line.startswith("password:"))
    return "\n".join(lines[start:-1])


def test_ensure_admin_never_says_a_password_changed_since_is_unchanged(monkeypatch, tmp_path):
    """A password set since the account was made (`manage.py changepassword
    admin`) was said to be "unchanged since the account was made", beside
    the file holding the old one: the block says only what it knows, that
    the password is neither the one kept nor NRLLM_ADMIN_PASSWORD's."""
    monkeypatch.delenv("NRLLM_ADMIN_PASSWORD", raising=False)
    kept = tmp_path / "admin-password"
    call_command("ensure_admin", "--password-file", str(kept), stdout=io.StringIO())
    admin = get_user_model().objects.get(username="admin")
    admin.set_password("set-by-changepassword")  # what changepassword does
    admin.save()

    out = io.StringIO()
    call_command("ensure_admin", "--password-file", str(kept), stdout=out)

    said = block_of(out)
    assert "unchanged" not in said, said
    assert said.startswith("password:   the one set when the account was made or since"), said
    assert f"nor the one kept in {kept}" in " ".join(said.split()), said
    assert "`manage.py changepassword admin` sets another" in said, said


def test_ensure_admin_keeps_a_generated_password_readable_by_its_owner_only(monkeypatch, tmp_path):
    """The file a generated password is kept in is its owner's only, also
    when a file was there before (one left by an earlier database, made
    readable by all): opening it with mode 0600 set no mode on a file that
    existed, and the new password was written readable by all."""
    monkeypatch.delenv("NRLLM_ADMIN_PASSWORD", raising=False)
    kept = tmp_path / "admin-password"
    kept.write_text("an old database's admin password\n")
    kept.chmod(0o644)

    call_command("ensure_admin", "--password-file", str(kept), stdout=io.StringIO())

    admin = get_user_model().objects.get(username="admin")
    assert admin.check_password(kept.read_text().strip())
    assert oct(kept.stat().st_mode & 0o777) == "0o600"


def test_ensure_admin_generates_and_prints_a_password(monkeypatch):
    monkeypatch.delenv("NRLLM_ADMIN_PASSWORD", raising=False)
    out = io.StringIO()
    call_command("ensure_admin", stdout=out)
    (line,) = [line for line in out.getvalue().splitlines() if line.startswith("password:")]
    password = line.split()[1]
    assert "(generated now)" in line
    assert get_user_model().objects.get(username="admin").check_password(password)
