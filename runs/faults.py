"""Database-level fault injection: a trigger that refuses step inserts.

Used by the demo data (a run whose write audit failed) and by the tests. The
fault is real — the database refuses the INSERT — so the code under test
runs unchanged.
"""

import contextlib

from django.db import connection

from runs.models import RunStep

_TRIGGER = "nrllm_refuse_step_insert"


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@contextlib.contextmanager
def step_inserts_refused(tool_name: str | None = None):
    """While active, the database refuses to insert steps (of ``tool_name`` only, if given).

    On SQLite the trigger is TEMP, so only this connection sees it; on
    PostgreSQL it applies to every connection, workers included.
    """
    table = RunStep._meta.db_table
    condition = f"NEW.tool_name = {_literal(tool_name)}" if tool_name else "TRUE"
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                f"CREATE TEMP TRIGGER {_TRIGGER} BEFORE INSERT ON main.{table} "
                f"WHEN {condition.replace('TRUE', '1')} "
                f"BEGIN SELECT RAISE(ABORT, 'step insert refused (injected fault)'); END"
            )
        else:
            cursor.execute(
                f"CREATE OR REPLACE FUNCTION {_TRIGGER}() RETURNS trigger AS $$ BEGIN "
                f"RAISE EXCEPTION 'step insert refused (injected fault)'; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                f"CREATE TRIGGER {_TRIGGER} BEFORE INSERT ON {table} FOR EACH ROW "
                f"WHEN ({condition}) EXECUTE FUNCTION {_TRIGGER}()"
            )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                cursor.execute(f"DROP TRIGGER IF EXISTS {_TRIGGER}")
            else:
                cursor.execute(f"DROP TRIGGER IF EXISTS {_TRIGGER} ON {table}")
                cursor.execute(f"DROP FUNCTION IF EXISTS {_TRIGGER}()")
