"""The append-only guard on run steps (G11), shared by the migrations that
create it and those that must restore it after SQLite rebuilds the table.

A step is never updated (``create_guard``, 0002). It is deleted only with
its whole run (``create_delete_guard``, 0021): the guard lets a step's
DELETE through once its run's row is gone in the same transaction (foreign
keys are checked at commit), so no statement takes a step out of a run
that stays. On SQLite that trigger names the runs table: a migration that
rebuilds ``runs_agentrun`` there must drop it first and create it after,
as 0010 does for the steps table's."""

FUNCTION = "nrllm_steps_append_only"
SQLITE_DELETE = f"{FUNCTION}_delete"


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


def create_delete_guard(apps, schema_editor):
    table = apps.get_model("runs", "RunStep")._meta.db_table
    runs = apps.get_model("runs", "AgentRun")._meta.db_table
    if schema_editor.connection.vendor == "postgresql":
        drop_guard(apps, schema_editor)
        # No format string in the message: Django hands this to psycopg, which reads %.
        schema_editor.execute(
            f"CREATE FUNCTION {FUNCTION}() RETURNS trigger AS $$ BEGIN "
            f"IF TG_OP = 'DELETE' AND NOT EXISTS (SELECT 1 FROM {runs} WHERE id = OLD.run_id) "
            f"THEN RETURN OLD; END IF; "
            f"RAISE EXCEPTION USING MESSAGE = "
            f"'run steps are append-only; ' || TG_OP || ' refused'; "
            f"END $$ LANGUAGE plpgsql"
        )
        schema_editor.execute(
            f"CREATE TRIGGER {FUNCTION} BEFORE UPDATE OR DELETE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()"
        )
    elif schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(
            f"CREATE TRIGGER IF NOT EXISTS {SQLITE_DELETE} BEFORE DELETE ON {table} "
            f"WHEN EXISTS (SELECT 1 FROM {runs} WHERE id = OLD.run_id) "
            f"BEGIN SELECT RAISE(ABORT, 'run steps are append-only; DELETE refused'); END"
        )


def drop_delete_guard(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        drop_guard(apps, schema_editor)
        create_guard(apps, schema_editor)
    elif schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {SQLITE_DELETE}")
