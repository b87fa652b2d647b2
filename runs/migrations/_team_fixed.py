"""The guard that keeps a row's team as it was created (G22): an agent's
and a run's ``team_id`` is never updated, whatever statement tries. Shared
by the migration that creates it and, on SQLite, by ``runs.apps``, which
puts it back after a table rebuild drops it."""

FUNCTION = "nrllm_team_never_changes"
#: (app, model) of each table whose team is fixed.
MODELS = (("agents", "Agent"), ("runs", "AgentRun"))
_MESSAGE = "the team of an agent or a run never changes; UPDATE of team_id refused"


def _tables(apps):
    return [apps.get_model(app, name)._meta.db_table for app, name in MODELS]


def create_guard(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(
            f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger AS $$ BEGIN "
            f"RAISE EXCEPTION '{_MESSAGE}'; END $$ LANGUAGE plpgsql"
        )
        for table in _tables(apps):
            schema_editor.execute(
                f"CREATE TRIGGER {FUNCTION} BEFORE UPDATE OF team_id ON {table} FOR EACH ROW "
                f"WHEN (OLD.team_id IS DISTINCT FROM NEW.team_id) EXECUTE FUNCTION {FUNCTION}()"
            )
    elif vendor == "sqlite":
        for table in _tables(apps):
            schema_editor.execute(
                f"CREATE TRIGGER IF NOT EXISTS {FUNCTION}_{table} BEFORE UPDATE OF team_id "
                f"ON {table} FOR EACH ROW WHEN OLD.team_id IS NOT NEW.team_id "
                f"BEGIN SELECT RAISE(ABORT, '{_MESSAGE}'); END"
            )


def drop_guard(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for table in _tables(apps):
        if vendor == "postgresql":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {FUNCTION} ON {table}")
        elif vendor == "sqlite":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {FUNCTION}_{table}")
    if vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
