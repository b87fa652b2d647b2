"""A reconciliation outlives its run: retention deletes a whole run past its
age, and what an operator found about its write stays for an audit.

Reversed, the foreign key's constraint comes back, which reconciliations of
deleted runs would break: the reverse refuses then, naming how many, rather
than delete audit records to make room for it."""

import django.db.models.deletion
from django.db import migrations, models


def refuse_with_reconciliations_of_deleted_runs(apps, schema_editor):
    reconciliations = apps.get_model("runs", "WriteReconciliation")
    runs = apps.get_model("runs", "AgentRun")
    outliving = reconciliations.objects.exclude(
        run_id__in=runs.objects.values("pk")
    ).count()
    if outliving:
        raise RuntimeError(
            f"{outliving} write reconciliation(s) belong to runs that retention deleted; "
            "the constraint this reverses to would not hold. Export and delete them "
            "first if they may go."
        )


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0021_steps_deleted_only_with_their_run'),
    ]

    operations = [
        migrations.AlterField(
            model_name='writereconciliation',
            name='run',
            field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='reconciliations', to='runs.agentrun'),
        ),
        # Reversed first: before the constraint is put back.
        migrations.RunPython(
            migrations.RunPython.noop, refuse_with_reconciliations_of_deleted_runs
        ),
    ]
