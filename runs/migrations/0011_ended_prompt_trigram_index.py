"""The prompt's trigram index covers ended runs only (PostgreSQL only).

A run's row is rewritten at every status change (create, claim, requeue,
settle), and PostgreSQL then adds a new entry to every index, the trigram
index included: as many trigrams as the prompt is long. With a 4 KB prompt
each claim and settle took three times as long. An ended run is not updated
again, so limited to ended runs its prompt is indexed once. The admin search
finds live runs through the status index (runs/admin/search.py).
"""

from django.db import migrations

ENDED = "('cancelled', 'completed', 'failed')"


def ended_runs_only(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS runs_agentrun_prompt_trgm")
        schema_editor.execute(
            "CREATE INDEX IF NOT EXISTS runs_agentrun_ended_prompt_trgm ON runs_agentrun "
            f"USING gin (UPPER(prompt) gin_trgm_ops) WHERE status IN {ENDED}"
        )


def every_run(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS runs_agentrun_ended_prompt_trgm")
        schema_editor.execute(
            "CREATE INDEX IF NOT EXISTS runs_agentrun_prompt_trgm ON runs_agentrun "
            "USING gin (UPPER(prompt) gin_trgm_ops)"
        )


class Migration(migrations.Migration):
    dependencies = [("runs", "0010_fewer_index_writes")]

    operations = [migrations.RunPython(ended_runs_only, every_run, elidable=False)]
