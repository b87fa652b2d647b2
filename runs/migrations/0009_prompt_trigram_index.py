"""A trigram index behind the admin's prompt search (PostgreSQL only).

The admin searches prompts with ``icontains``, which PostgreSQL runs as
``UPPER(prompt) LIKE UPPER('%term%')``: no B-tree can serve a leading
wildcard, so without this index every search scans the table. pg_trgm is a
trusted extension (PostgreSQL 13+): the database owner may create it.
SQLite (the embedded default) gets neither.
"""

from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations

INDEXES = {
    "runs_agentrun_prompt_trgm": "USING gin (UPPER(prompt) gin_trgm_ops)",
    # The same search matches a worker by its lease owner (``iexact``); the OR
    # of both can only use indexes if both sides have one. Only running runs
    # have an owner, so the partial index stays small.
    "runs_agentrun_lease_owner": "(UPPER(lease_owner)) WHERE UPPER(lease_owner) <> ''",
}


def create_indexes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name, definition in INDEXES.items():
            schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON runs_agentrun {definition}")


def drop_indexes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name in INDEXES:
            schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("runs", "0008_provider_circuit_and_usage")]

    operations = [
        TrigramExtension(),
        migrations.RunPython(create_indexes, drop_indexes, elidable=False),
    ]
