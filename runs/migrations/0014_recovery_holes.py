"""Job ids that never repeat, reconciliations bound to one write, and the
new ways a run can end (issue 16)."""

from django.db import migrations, models
from django.db.models import F, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce


def carry_over(apps, schema_editor):
    """A queued run's job, already in Redis, keeps its id (it was numbered by
    the retry budget). A reconciliation is bound to the attempt its run was
    at when it was made — the lease token of the run's last step by then —
    never to a later one: a write left in doubt again after it (what one
    reconciliation per run let happen) stays in doubt. With no step before
    it, 0, which no attempt has."""
    AgentRun = apps.get_model("runs", "AgentRun")
    RunStep = apps.get_model("runs", "RunStep")
    WriteReconciliation = apps.get_model("runs", "WriteReconciliation")
    AgentRun.objects.update(dispatch_count=F("requeue_count"))
    attempt_then = (
        RunStep.objects.filter(run_id=OuterRef("run_id"), created_at__lte=OuterRef("created_at"))
        .order_by("-sequence")
        .values("lease_token")[:1]
    )
    WriteReconciliation.objects.update(lease_token=Coalesce(Subquery(attempt_then), Value(0)))


class Migration(migrations.Migration):
    dependencies = [("runs", "0013_journal_resume")]

    operations = [
        migrations.AddField(
            model_name="agentrun",
            name="dispatch_count",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AlterField(
            model_name="writereconciliation",
            name="run",
            field=models.ForeignKey(
                on_delete=models.deletion.CASCADE,
                related_name="reconciliations",
                to="runs.agentrun",
            ),
        ),
        migrations.AddField(
            model_name="writereconciliation",
            name="lease_token",
            field=models.PositiveIntegerField(default=0),
            preserve_default=False,
        ),
        migrations.RunPython(carry_over, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="writereconciliation",
            constraint=models.UniqueConstraint(
                fields=("run", "lease_token", "idempotency_key"),
                name="reconciliation_one_per_write",
            ),
        ),
        migrations.AlterField(
            model_name="agentrun",
            name="termination_reason",
            field=models.CharField(
                blank=True,
                choices=[
                    ("completed", "Completed"),
                    ("max_iterations", "Max Iterations"),
                    ("cancelled", "Cancelled"),
                    ("provider_failed", "Provider Failed"),
                    ("not_retryable", "Not Retryable"),
                    ("retries_exhausted", "Retries Exhausted"),
                    ("write_interrupted", "Write Interrupted"),
                    ("audit_failed", "Audit Failed"),
                    ("dispatch_failed", "Dispatch Failed"),
                    ("lease_lost_no_request", "Lease Lost No Request"),
                    ("journal_unreplayable", "Journal Unreplayable"),
                    ("abandoned", "Abandoned"),
                ],
                max_length=32,
            ),
        ),
        migrations.AlterField(
            model_name="deadletter",
            name="reason",
            field=models.CharField(
                choices=[
                    ("not_retryable", "Not Retryable"),
                    ("retries_exhausted", "Retries Exhausted"),
                    ("write_interrupted", "Write Interrupted"),
                    ("journal_unreplayable", "Journal Unreplayable"),
                    ("dispatch_failed", "Dispatch Failed"),
                ],
                max_length=32,
            ),
        ),
    ]
