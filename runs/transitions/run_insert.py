"""Every new run, from one INSERT built in one place: a queued run
(``create_queued_run``), an interactive run already running
(``begin_interactive``) and a rerun with its copy of the journal
(``create_rerun``, G20).

On PostgreSQL the INSERT is one prepared statement: the ORM's ``create``
compiles the INSERT anew each time (a quarter of a millisecond, as much as
the statement's own round trip on a fast disk). The statement is built once
per process and shape of run from the model itself — a column not given here
takes what the ORM would insert for it (its field's default) — so a field
added to ``AgentRun`` is inserted without touching this module. Elsewhere
(SQLite, the embedded default) the same row goes through the ORM's
``create``.
"""

import functools
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import F
from psycopg.sql import Literal

from ground.commits import reaching_disk
from runs.models import AgentRun, RunStep
from runs.models.vocabulary import RunMode, RunStatus
from runs.transitions.common import Lease, append_step, db_time, log_change


@dataclass(frozen=True)
class DatabaseTime:
    """A column the database's clock sets, ``after_seconds`` from the
    statement's time (one clock for every run time, G5)."""

    after_seconds: float = 0


#: The database's time of the INSERT.
NOW = DatabaseTime()


def create_queued_run(
    request: dict,
    prompt: str,
    *,
    submitted_by=None,
    submitted_via: str = "",
    agent_version=None,
    team_id: int | None = None,
) -> AgentRun:
    """Store a ``queued`` run, due now; the caller dispatches its job after
    commit. The request's ``webhook`` is stored in ``webhook_url`` too (G19).
    ``team_id``: the team it is started in (None: the default team)."""
    return insert_run(
        request,
        prompt,
        status=RunStatus.QUEUED,
        mode=RunMode.QUEUED,
        submitted_by=submitted_by,
        submitted_via=submitted_via,
        agent_version=agent_version,
        team_id=team_id,
        available_at=NOW,
    )


def begin_interactive(
    request: dict,
    prompt: str,
    owner: str,
    lease_seconds: float,
    *,
    submitted_by=None,
    submitted_via: str = "",
    agent_version=None,
    team_id: int | None = None,
) -> Lease:
    """Store an ``interactive`` run already running under a first lease. In a
    caller's transaction it is a savepoint of its own: a refused row leaves
    the caller's transaction usable."""
    with transaction.atomic():
        run = insert_run(
            request,
            prompt,
            status=RunStatus.RUNNING,
            mode=RunMode.INTERACTIVE,
            submitted_by=submitted_by,
            submitted_via=submitted_via,
            agent_version=agent_version,
            team_id=team_id,
            lease_owner=owner,
            lease_token=1,
            lease_expires_at=DatabaseTime(lease_seconds),
            started_at=NOW,
        )
    return Lease(str(run.pk), owner, 1)


def create_rerun(
    of_run_id,
    new_id,
    *,
    seen_step_count: int,
    from_sequence: int,
    request: dict,
    prompt: str,
    steps: list[dict],
    original_step: dict,
    submitted_by,
    submitted_via: str,
    agent_version=None,
    team_id: int | None = None,
) -> AgentRun | None:
    """Store a ``queued`` run ``new_id`` that reruns ``of_run_id`` from its step
    ``from_sequence``: ``steps`` are its first steps (the operator step
    naming the original, then the copied journal), unnumbered; the
    original gets ``original_step``, to which the new run's id is added.
    None if the original changed since it was seen. The caller runs this in
    a transaction and dispatches the run after commit.

    The original is guarded by what its verdict was made on (ended, the same
    step count): of two concurrent reruns, or a rerun and a requeue, of one
    run the one that comes second matches nothing."""
    with reaching_disk():
        seen = AgentRun.objects.filter(
            pk=of_run_id, status__in=RunStatus.terminal(), step_count=seen_step_count
        )
        if not seen.update(step_count=F("step_count") + 1):
            return None
        named = {**original_step["result"], "rerun": str(new_id)}
        sequence, _ = append_step(of_run_id, None, {**original_step, "result": named})
        run = insert_run(
            request,
            prompt,
            status=RunStatus.QUEUED,
            mode=RunMode.QUEUED,
            submitted_by=submitted_by,
            submitted_via=submitted_via,
            agent_version=agent_version,
            team_id=team_id,
            id=new_id,
            available_at=NOW,
            rerun_of=of_run_id,
            rerun_from_sequence=from_sequence,
            # The claim numbers its request step after these: an attempt
            # that finds steps before its own replays the journal (G12).
            step_count=len(steps),
        )
        RunStep.objects.bulk_create(
            RunStep(run_id=new_id, sequence=number, lease_token=0, **step)
            for number, step in enumerate(steps, start=1)
        )
    log_change("operator_rerun", of_run_id, sequence=sequence, rerun=str(new_id))
    return run


def insert_run(
    request: dict,
    prompt: str,
    *,
    status: RunStatus,
    mode: RunMode,
    submitted_by=None,
    submitted_via: str = "",
    agent_version=None,
    team_id: int | None = None,
    **columns,
) -> AgentRun:
    """Store a new run in one INSERT and return it as the ORM would have,
    with the values the row got. ``columns``: further fields by name, each a
    value or a ``DatabaseTime``; every other takes its field's default. The
    request's ``webhook`` is stored in ``webhook_url`` (G19); a run given no
    ``team_id`` is the default team's (the column's database default)."""
    if team_id is not None:
        columns["team_id"] = team_id
    row = {
        "id": uuid.uuid4(),
        "request": request,
        "prompt": prompt,
        "status": status,
        "mode": mode,
        "submitted_by": submitted_by,
        "submitted_via": submitted_via,
        "agent_version": agent_version,
        "webhook_url": request.get("webhook", ""),
        **columns,
    }
    if connection.vendor == "postgresql":
        return _insert_prepared(row)
    return AgentRun.objects.create(
        **{
            name: db_time(value.after_seconds) if isinstance(value, DatabaseTime) else value
            for name, value in row.items()
        }
    )


#: Fields written into the statement's text (a statement of its own for each
#: pair of values); every other given field is a parameter.
_LITERAL = ("status", "mode")


def _insert_prepared(row: dict) -> AgentRun:
    """``insert_run`` on PostgreSQL: the prepared statement of the row's shape."""
    meta = AgentRun._meta
    given = tuple(
        sorted(
            name
            for name, value in row.items()
            if name not in _LITERAL and not isinstance(value, DatabaseTime)
        )
    )
    clock = tuple(
        sorted(
            (meta.get_field(name).column, value.after_seconds != 0)
            for name, value in row.items()
            if isinstance(value, DatabaseTime)
        )
    )
    literals = (RunStatus(row["status"]).value, RunMode(row["mode"]).value)
    sql, computed, returned = _statement(given, clock, literals)
    params = {
        f"default_{index}": field.get_db_prep_save(field.get_default(), connection)
        for index, field in enumerate(computed)
    }
    for name in given:
        field, value = meta.get_field(name), row[name]
        if field.is_relation and value is not None and name != field.attname:
            value = value.pk
        params[field.column] = field.get_db_prep_save(value, connection)
    for name, value in row.items():
        if isinstance(value, DatabaseTime) and value.after_seconds:
            params[meta.get_field(name).column] = timedelta(seconds=value.after_seconds)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        stored_row = cursor.fetchone()
    stored = {}
    for field, value in zip(returned, stored_row[:-1], strict=True):
        for converter in field.get_db_converters(connection):
            value = converter(value, None, connection)
        stored[field.attname] = value
    run = AgentRun(**{name: row[name] for name in given}, **stored)
    run._state.adding = False
    run._state.db = connection.alias
    return run


@functools.cache
def _statement(given: tuple, clock: tuple, literals: tuple) -> tuple[str, tuple, tuple]:
    """The INSERT's text, the fields whose defaults are parameters and the
    fields it returns (every one not ``given``), in column order. ``given``
    fields are parameters; ``clock`` columns are the database's time, with
    an interval parameter when offset; ``_LITERAL`` fields have ``literals``.
    A constant default is written into the text (quoted by psycopg): fewer
    parameters to adapt on every run. A database default is left to the
    database (``DEFAULT``); a callable one (a new id, the time) is called for
    every run; an automatic time is the database's clock."""
    given_columns = {AgentRun._meta.get_field(name).column for name in given}
    clock_columns = dict(clock)
    fixed = dict(zip(_LITERAL, literals, strict=True))
    columns, values, computed, returned = [], [], [], []
    for field in AgentRun._meta.concrete_fields:
        column = field.column
        columns.append(connection.ops.quote_name(column))
        if column in given_columns:
            values.append(f"%({column})s")
            continue
        returned.append(field)
        automatic = getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)
        if column in clock_columns:
            offset = f" + %({column})s" if clock_columns[column] else ""
            values.append(f"statement_timestamp(){offset}")
        elif automatic:
            values.append("statement_timestamp()")
        elif field.name in fixed:
            values.append(_literal(fixed[field.name]))
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
