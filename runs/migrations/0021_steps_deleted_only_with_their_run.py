"""G11 on PostgreSQL: a step's DELETE is refused too, unless its whole run
is deleted in the same transaction, and a TRUNCATE of the steps while runs
remain (the guard refused only UPDATE before)."""

from django.db import migrations

from runs.migrations._append_only import create_delete_guard, drop_delete_guard


class Migration(migrations.Migration):
    dependencies = [("runs", "0020_submitted_via_console")]

    operations = [migrations.RunPython(create_delete_guard, drop_delete_guard)]
