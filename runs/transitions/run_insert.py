"""The INSERT of a queued run on PostgreSQL, as one prepared statement.

Every run is created by it (``transitions.create_queued_run``), once per
run: the ORM's ``create`` compiles the INSERT anew each time (a quarter of a
millisecond, as much as the statement's own round trip on a fast disk).
The statement is built once per process from the model itself — a column
not given here takes what the ORM would insert for it (its field's default) —
so a field added to ``AgentRun`` is inserted without touching this module.
"""

import functools
import uuid

from django.db import connection
from psycopg.sql import Literal

from runs.models import AgentRun
from runs.vocabulary import RunMode, RunStatus

#: Columns this statement gives; every other takes its field's default.
_GIVEN = (
    "id",
    "request",
    "prompt",
    "submitted_by_id",
    "submitted_via",
    "agent_version_id",
    "webhook_url",
)
#: Columns the database's clock sets (one clock for every run time, G5).
_NOW = ("available_at", "created_at")
_FIXED = {"status": RunStatus.QUEUED.value, "mode": RunMode.QUEUED.value}


@functools.cache
def _statement() -> tuple[str, tuple, tuple]:
    """The INSERT's text, the fields whose defaults are parameters and the
    fields it returns (every one it does not give), in column order. A
    constant default is written into the text (quoted by psycopg): fewer
    parameters to adapt on every run. A database default is left to the
    database (``DEFAULT``); a callable one (a new id, the time) is called for
    every run; an automatic time is the database's clock."""
    columns, values, computed, returned = [], [], [], []
    for field in AgentRun._meta.concrete_fields:
        column = field.column
        columns.append(connection.ops.quote_name(column))
        if column in _GIVEN:
            values.append(f"%({column})s")
            continue
        returned.append(field)
        automatic = getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)
        if column in _NOW or automatic:
            values.append("statement_timestamp()")
        elif column in _FIXED:
            values.append(_literal(_FIXED[column]))
        elif field.has_db_default() and not field.has_default():
            values.append("DEFAULT")
        elif callable(field.default):
            values.append(f"%(default_{len(computed)})s")
            computed.append(field)
        else:
            prepared = field.get_db_prep_save(field.get_default(), connection)
            if prepared is not None and type(prepared) not in (str, int, bool):
                values.append(f"%(default_{len(computed)})s")
                computed.append(field)
            else:
                values.append(_literal(prepared))
    sql = (
        f"INSERT INTO {AgentRun._meta.db_table} ({', '.join(columns)}) "
        f"VALUES ({', '.join(values)}) "
        f"RETURNING {', '.join(connection.ops.quote_name(f.column) for f in returned)}, "
        # Last, and read by nobody: the run's creation commits once it is on
        # disk, whatever the session's or database's default (G12).
        "(SELECT set_config('synchronous_commit', 'on', true))"
    )
    return sql, tuple(computed), tuple(returned)


def _literal(value) -> str:
    # Doubled: the driver reads every % of the text as a placeholder's.
    return Literal(value).as_string().replace("%", "%%")


def insert_queued_run(
    request: dict, prompt: str, *, submitted_by, submitted_via: str, agent_version=None
):
    """Store a ``queued`` run and return it as the ORM would have, with the
    values the row got."""
    sql, computed, returned = _statement()
    run_id = uuid.uuid4()
    request_field = AgentRun._meta.get_field("request")
    params = {
        f"default_{index}": field.get_db_prep_save(field.get_default(), connection)
        for index, field in enumerate(computed)
    }
    params.update(
        id=run_id,
        request=request_field.get_db_prep_save(request, connection),
        prompt=prompt,
        submitted_by_id=submitted_by.pk if submitted_by is not None else None,
        submitted_via=submitted_via,
        agent_version_id=agent_version.pk if agent_version is not None else None,
        webhook_url=request.get("webhook", ""),
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    stored = {}
    for field, value in zip(returned, row[:-1], strict=True):
        for converter in field.get_db_converters(connection):
            value = converter(value, None, connection)
        stored[field.attname] = value
    run = AgentRun(
        id=run_id,
        request=request,
        prompt=prompt,
        submitted_by=submitted_by,
        submitted_via=submitted_via,
        agent_version=agent_version,
        webhook_url=request.get("webhook", ""),
        **stored,
    )
    run._state.adding = False
    run._state.db = connection.alias
    return run
