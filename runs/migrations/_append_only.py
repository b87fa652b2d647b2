"""The append-only guard on run steps (G11), shared by the migrations that
create it and those that must restore it after SQLite rebuilds the table.

A step is never updated (``create_guard``, 0002: PostgreSQL and SQLite).
On PostgreSQL it is deleted only with its whole run (``create_delete_guard``,
0021): a step's DELETE goes through once its run's row is gone in the same
transaction (foreign keys are checked at commit), so no statement takes a
step out of a run that stays; a TRUNCATE of the steps is refused while any
run remains."""

FUNCTION = "nrllm_steps_append_only"
TRUNCATE_GUARD = "nrllm_steps_not_truncated"


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
    """PostgreSQL only: on SQLite a trigger naming the runs table breaks
    every later rebuild of that table, and Django's flush there deletes the
    tables in no fixed order (G11 says so)."""
    table = apps.get_model("runs", "RunStep")._meta.db_table
    runs = apps.get_model("runs", "AgentRun")._meta.db_table
    if schema_editor.connection.vendor != "postgresql":
        return
    drop_guard(apps, schema_editor)
    # No format string in the messages: Django hands these to psycopg, which reads %.
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
    # TRUNCATE fires no row trigger. Refused while any run stays; Django's
    # flush truncates every table in one statement, which then holds none.
    schema_editor.execute(
        f"CREATE FUNCTION {TRUNCATE_GUARD}() RETURNS trigger AS $$ BEGIN "
        f"IF EXISTS (SELECT 1 FROM {runs}) THEN RAISE EXCEPTION USING MESSAGE = "
        f"'run steps are append-only; TRUNCATE refused while runs remain'; END IF; "
        f"RETURN NULL; END $$ LANGUAGE plpgsql"
    )
    schema_editor.execute(
        f"CREATE TRIGGER {TRUNCATE_GUARD} AFTER TRUNCATE ON {table} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {TRUNCATE_GUARD}()"
    )


def drop_delete_guard(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        table = apps.get_model("runs", "RunStep")._meta.db_table
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TRUNCATE_GUARD} ON {table}")
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {TRUNCATE_GUARD}()")
        drop_guard(apps, schema_editor)
        create_guard(apps, schema_editor)
