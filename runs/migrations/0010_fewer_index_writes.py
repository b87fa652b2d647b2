"""Fewer index entries per write: a step's lease renewal becomes a heap-only
(HOT) update, and a step no longer has a run_id index beside its unique
(run, sequence) index.

On SQLite, dropping the foreign key's index rebuilds the steps table, which
drops its append-only trigger (0002) with it; the trigger is put back after
the rebuild, in both directions.
"""

import django.db.models.deletion
from django.db import migrations, models

from runs.migrations import _append_only


def restore_sqlite_guard(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        _append_only.create_guard(apps, schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0009_prompt_trigram_index"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="agentrun",
            name="run_status_lease_idx",
        ),
        # Runs when migrating backwards, after the rebuild below is undone.
        migrations.RunPython(migrations.RunPython.noop, restore_sqlite_guard),
        migrations.AlterField(
            model_name="runstep",
            name="run",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="steps",
                to="runs.agentrun",
            ),
        ),
        migrations.RunPython(restore_sqlite_guard, migrations.RunPython.noop),
    ]
