"""Steps are append-only: the database itself refuses an UPDATE of a step (G11)."""

from django.db import migrations

from runs.migrations._append_only import create_guard, drop_guard


class Migration(migrations.Migration):
    dependencies = [("runs", "0001_initial")]
    operations = [migrations.RunPython(create_guard, drop_guard)]
