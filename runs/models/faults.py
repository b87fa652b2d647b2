"""Database-level fault injection: triggers that make the database refuse writes.

Used by the demo data (a run whose write audit failed) and by the tests. The
fault is real — the database refuses the statement — so the code under test
runs unchanged.
"""

import contextlib

from django.db import connection

from runs.models import AgentRun, RunStep

#: Ends the message of every refusal injected here: what the database says,
#: so a log line of the fault says it was injected (``seed_demo`` tells an
#: expected fault from a real one by it).
INJECTED = "(injected fault)"


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@contextlib.contextmanager
def _refusing_trigger(name: str, event: str, table: str, condition: str, message: str):
    """While active, ``event`` (INSERT/UPDATE) on ``table`` fails where ``condition`` holds.

    On SQLite the trigger is TEMP, so only this connection sees it; on
    PostgreSQL it applies to every connection, workers included.
    """
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                f"CREATE TEMP TRIGGER {name} BEFORE {event} ON main.{table} "
                f"WHEN {condition} BEGIN SELECT RAISE(ABORT, {_literal(message)}); END"
            )
        else:
            cursor.execute(
                f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$ BEGIN "
                f"RAISE EXCEPTION {_literal(message)}; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW "
                f"WHEN ({condition}) EXECUTE FUNCTION {name}()"
            )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                cursor.execute(f"DROP TRIGGER IF EXISTS {name}")
            else:
                cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
                cursor.execute(f"DROP FUNCTION IF EXISTS {name}()")


def step_inserts_refused(tool_name: str | None = None, *, kind: str | None = None):
    """The database refuses to insert steps (of ``tool_name``, of ``kind``, if given)."""
    conditions = [f"NEW.tool_name = {_literal(tool_name)}"] if tool_name else []
    conditions += [f"NEW.kind = {_literal(kind)}"] if kind else []
    return _refusing_trigger(
        "nrllm_refuse_step_insert",
        "INSERT",
        RunStep._meta.db_table,
        " AND ".join(conditions) or "1 = 1",
        f"step insert refused {INJECTED}",
    )


def run_status_changes_refused(from_status: str = "running"):
    """The database refuses to move a run out of ``from_status`` (settle, requeue...)."""
    return _refusing_trigger(
        "nrllm_refuse_status_change",
        "UPDATE",
        AgentRun._meta.db_table,
        f"OLD.status = {_literal(from_status)} AND NEW.status <> OLD.status",
        f"run status change refused {INJECTED}",
    )


def approval_requests_refused():
    """The database refuses to create approval requests (a run cannot park)."""
    from runs.models import ApprovalRequest

    return _refusing_trigger(
        "nrllm_refuse_approval_request",
        "INSERT",
        ApprovalRequest._meta.db_table,
        "1 = 1",
        f"approval request refused {INJECTED}",
    )
