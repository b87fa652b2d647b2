"""Attempts resume from the run's journal (G12).

Before this, every attempt started over, so a run's steps hold one
conversation per attempt. For a run that may still be re-executed, the
journal begins where its last attempt's conversation does (its first llm or
tool step, found by the highest lease token among them): resuming replays
that conversation, which is whole, and never a mix of several. Completed
runs are never re-executed and keep 0.
"""

from django.db import migrations, models

LAST_ATTEMPTS_CONVERSATION = """
UPDATE runs_agentrun SET journal_begins_after = COALESCE((
    SELECT min(step.sequence) - 1 FROM runs_runstep step
    WHERE step.run_id = runs_agentrun.id AND step.kind IN ('llm', 'tool')
      AND step.lease_token = (
        SELECT max(other.lease_token) FROM runs_runstep other
        WHERE other.run_id = runs_agentrun.id AND other.kind IN ('llm', 'tool'))
), 0)
WHERE status <> 'completed'
"""


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0012_database_time_zone_named_utc'),
    ]

    operations = [
        migrations.AddField(
            model_name='agentrun',
            name='journal_begins_after',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='agentrun',
            name='tokens_saved_by_replay',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AlterField(
            model_name='agentrun',
            name='termination_reason',
            field=models.CharField(blank=True, choices=[('completed', 'Completed'), ('max_iterations', 'Max Iterations'), ('cancelled', 'Cancelled'), ('provider_failed', 'Provider Failed'), ('not_retryable', 'Not Retryable'), ('retries_exhausted', 'Retries Exhausted'), ('write_interrupted', 'Write Interrupted'), ('audit_failed', 'Audit Failed'), ('dispatch_failed', 'Dispatch Failed'), ('lease_lost_no_request', 'Lease Lost No Request'), ('journal_unreplayable', 'Journal Unreplayable')], max_length=32),
        ),
        migrations.AlterField(
            model_name='deadletter',
            name='reason',
            field=models.CharField(choices=[('not_retryable', 'Not Retryable'), ('retries_exhausted', 'Retries Exhausted'), ('write_interrupted', 'Write Interrupted'), ('journal_unreplayable', 'Journal Unreplayable')], max_length=32),
        ),
        migrations.AlterField(
            model_name='runstep',
            name='kind',
            field=models.CharField(choices=[('request', 'Request'), ('llm', 'Llm'), ('tool', 'Tool'), ('operator', 'Operator'), ('reaper', 'Reaper'), ('resume', 'Resume')], max_length=16),
        ),
        migrations.RunSQL(LAST_ATTEMPTS_CONVERSATION, reverse_sql=migrations.RunSQL.noop),
    ]
