"""On PostgreSQL, a GIN index on the offered tools, for the "offers tool" filter."""

from django.db import migrations


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "CREATE INDEX IF NOT EXISTS run_request_tools_gin "
            "ON runs_agentrun USING gin ((request -> 'tools'))"
        )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS run_request_tools_gin")


class Migration(migrations.Migration):
    dependencies = [("runs", "0006_list_filter_indexes")]
    operations = [migrations.RunPython(create, drop)]
