"""No-op tools for the step-overhead figures: only the runtime's cost remains."""

import os

import psycopg
from django.conf import settings

from runs.transitions.step_journal import COMMIT_WITHOUT_FLUSH
from tools.contract import Tool
from tools.effects import ToolEffect

_NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


class NoopRead(Tool):
    name = "noop_read"
    description = "does nothing (read-only)"
    parameters = _NO_ARGUMENTS

    def run(self, arguments, context):
        return {}


class NoopIdempotentWrite(NoopRead):
    name = "noop_idempotent_write"
    description = "does nothing (idempotent write: fence + audit)"
    effect = ToolEffect.IDEMPOTENT_WRITE


class NoopNonIdempotentWrite(NoopRead):
    name = "noop_non_idempotent_write"
    description = "does nothing (non-idempotent write: fence + audit + replay lookup)"
    effect = ToolEffect.NON_IDEMPOTENT_WRITE


def noop_job():
    """A bare RQ job, the queue figure's baseline."""
    return None


# --- the queue figure's physical floor ---------------------------------------

FLOOR_TABLES = (
    "DROP TABLE IF EXISTS bench_floor_step, bench_floor_run",
    "CREATE TABLE bench_floor_run"
    " (id int PRIMARY KEY, status text NOT NULL, changed_at timestamptz)",
    "CREATE TABLE bench_floor_step (id bigserial PRIMARY KEY, run int NOT NULL, body text)",
)
# One statement, one commit: a guarded change of the row and a ~1 KB record.
_FLOOR_TRANSITION = """
    WITH taken AS (
        UPDATE bench_floor_run SET status = %(to)s, changed_at = now()
        WHERE id = %(row)s AND status = %(from)s RETURNING id
    )
    INSERT INTO bench_floor_step (run, body) SELECT id, %(body)s FROM taken {commit}
"""
# The claim's commit does not wait for the WAL flush, as the runtime's does not
# (runs/transitions/step_journal.py); the settle's does.
_FLOOR_CLAIM = _FLOOR_TRANSITION.format(commit=f", {COMMIT_WITHOUT_FLUSH}")
_FLOOR_SETTLE = _FLOOR_TRANSITION.format(commit="")
_FLOOR_BODY = "x" * 1024
_floor_connections: dict[int, object] = {}


def database_dsn() -> str:
    """The bench database, for plain psycopg connections beside Django's."""
    db = settings.DATABASES["default"]
    return f"host={db['HOST']} port={db['PORT']} user={db['USER']} dbname={db['NAME']}"


def durable_floor_job(row: int) -> None:
    """A bare RQ job doing the durable minimum of a one-step run: two commits,
    each one round trip that changes the row and appends a ~1 KB record
    (the claim, then the answer with the settle; only the settle waits for
    the WAL flush, as in the runtime). Its connection lives as the
    runtime's does: kept by the process with DATABASE_CONN_MAX_AGE, else
    opened and closed by the job (a forked work horse opens its own)."""
    connection = _floor_connections.get(os.getpid())
    if connection is None:
        connection = psycopg.connect(database_dsn(), autocommit=True)
        _floor_connections[os.getpid()] = connection
    for statement, status_from, status_to in (
        (_FLOOR_CLAIM, "queued", "running"),
        (_FLOOR_SETTLE, "running", "completed"),
    ):
        connection.execute(
            statement, {"row": row, "from": status_from, "to": status_to, "body": _FLOOR_BODY}
        )
    if not settings.DATABASES["default"]["CONN_MAX_AGE"]:
        connection.close()
        del _floor_connections[os.getpid()]
