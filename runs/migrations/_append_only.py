"""The append-only guard on run steps (G11), shared by the migrations that
create it and those that must restore it after SQLite rebuilds the table."""

FUNCTION = "nrllm_steps_append_only"


def create_guard(apps, schema_editor):
    table = apps.get_model("runs", "RunStep")._meta.db_table
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE FUNCTION {FUNCTION}() RETURNS trigger AS $$ BEGIN "
            f"RAISE EXCEPTION 'run steps are append-only; UPDATE refused'; END $$ LANGUAGE plpgsql"
        )
        schema_editor.execute(
            f"CREATE TRIGGER {FUNCTION} BEFORE UPDATE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()"
        )
    elif schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(
            f"CREATE TRIGGER IF NOT EXISTS {FUNCTION} BEFORE UPDATE ON {table} "
            f"BEGIN SELECT RAISE(ABORT, 'run steps are append-only; UPDATE refused'); END"
        )


def drop_guard(apps, schema_editor):
    table = apps.get_model("runs", "RunStep")._meta.db_table
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {FUNCTION} ON {table}")
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
    elif schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {FUNCTION}")
