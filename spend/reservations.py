"""Reservations before model calls: neither a submitter's budget nor a
team's is ever overshot (G21).

Before a model call its attempt reserves the call's largest possible cost
(``spend.call_size``: the prompt's UTF-8 bytes, an upper bound of its
tokens for a byte-level tokenizer, plus the completion's ``max_tokens``)
against the period of every budget the run is under — its submitter's,
its team's — in one guarded statement on their ``SpendHold`` rows: it
locks them (in ``SpendHold.LOCK_ORDER``), and reserves on all of them only
while ``spent + reserved + this`` stays within each one's budget, so two
runs cannot both take the last room of either, and a call never holds one
budget without the other. The statement that records the turn settles it
(``SETTLE_CTES`` in the record's single statement: the reservations go, the
reported spend comes, on every hold). A failed or abandoned call's attempt
releases it (``release``); a dead attempt's is released by the reaper
(``release_dead``).

Every statement here that changes more than one hold locks them in
``SpendHold.LOCK_ORDER`` first: a reservation, a settle and a release of
two runs that share a team but not a submitter (or the other way round)
would otherwise each lock one hold and wait for the other's — a deadlock
PostgreSQL breaks by failing one of them.

PostgreSQL only: elsewhere (SQLite, the embedded default) no reservation is
made and G17's checks alone apply.
"""

from dataclasses import dataclass
from decimal import Decimal

from django.db import connection

from spend.budgets import Budget, Spent
from spend.models import DailySpend, SpendHold, SpendReservation

_HOLD = SpendHold._meta.db_table
_RESERVATION = SpendReservation._meta.db_table
_DAILY = DailySpend._meta.db_table
_LOCK_ORDER = ", ".join(f"hold.{column}" for column in SpendHold.LOCK_ORDER.split(", "))


@dataclass(frozen=True)
class Owner:
    """Whose budget a hold keeps: a submitter's (``team`` 0) or a team's
    (``submitter`` 0)."""

    submitter: int
    team: int
    budget: Budget

    @property
    def is_team(self) -> bool:
        return self.team != 0


#: The first day of the period the database's clock is in, for a hold's
#: ``period`` (a column or a parameter).
_CURRENT_START = (
    "CASE {period} WHEN 'month' THEN date_trunc('month', statement_timestamp() AT TIME ZONE 'UTC')"
    "::date ELSE (statement_timestamp() AT TIME ZONE 'UTC')::date END"
)


def _hold_row(index: int, owner: Owner) -> str:
    """The row ``hold_for`` makes for ``owner`` (its parameters suffixed
    ``index``): the period's spend so far, from ``DailySpend``."""
    start = _CURRENT_START.format(period=f"%(period_{index})s::text")
    whose = "team_id" if owner.is_team else "submitter"
    return (
        f"SELECT %(submitter_{index})s::bigint, %(team_{index})s::bigint,"
        f" %(period_{index})s::text, {start},"
        " COALESCE(SUM(input_tokens + output_tokens), 0), COALESCE(SUM(cost), 0), 0, 0"
        f" FROM {_DAILY} WHERE {whose} = %(owner_{index})s AND day >= {start}"
    )


def hold_for(owners: list[Owner]) -> list[int]:
    """The ids of the owners' ``SpendHold`` rows (in the order of
    ``owners``) for the period the database's clock is in (not the
    claim's: an attempt's calls after midnight are the new day's), each
    made from the period's ``DailySpend`` if it is the first, and caught up
    with it if not: turns recorded with no reservation to settle (an
    attempt claimed while the budget was not there) are in the period's
    ``DailySpend`` alone. Never lowered: a settle adds to both. One
    statement, the rows taken in ``SpendHold.LOCK_ORDER``."""
    params = {}
    for index, owner in enumerate(owners):
        params |= {
            f"submitter_{index}": owner.submitter,
            f"team_{index}": owner.team,
            f"owner_{index}": owner.team or owner.submitter,
            f"period_{index}": owner.budget.period,
        }
    rows = " UNION ALL ".join(_hold_row(index, owner) for index, owner in enumerate(owners))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {_HOLD} (submitter, team, period, start, spent_tokens, spent_cost,"
            " reserved_tokens, reserved_cost)"
            f" SELECT * FROM ({rows}) AS owner ORDER BY 1, 2, 3, 4"
            " ON CONFLICT (submitter, team, period, start) DO UPDATE SET"
            f" spent_tokens = GREATEST({_HOLD}.spent_tokens, EXCLUDED.spent_tokens),"
            f" spent_cost = GREATEST({_HOLD}.spent_cost, EXCLUDED.spent_cost)"
            " RETURNING id, submitter, team",
            params,
        )
        found = {(submitter, team): hold for hold, submitter, team in cursor.fetchall()}
    return [found[owner.submitter, owner.team] for owner in owners]


#: ``_CURRENT_START`` of a hold row: a reservation is made only in the
#: period the database's clock is in.
_HOLDS_PERIOD_START = _CURRENT_START.format(period="hold.period")


def _reserve_sql(count: int) -> str:
    """The reservation on ``count`` holds: ``locked`` takes their rows in
    ``LOCK_ORDER`` and reads them as they are once locked (a row another
    reservation changed meanwhile is read again: its latest version); the
    UPDATE reserves on every one only when each fits (``fits``), and the
    reservation's rows are inserted by the same statement."""
    asked = ", ".join(
        f"(%(hold_{i})s::bigint, %(max_tokens_{i})s::bigint, %(max_cost_{i})s::numeric)"
        for i in range(count)
    )
    return f"""
    WITH asked (hold_id, max_tokens, max_cost) AS (VALUES {asked}),
    locked AS (
        SELECT hold.id, hold.start = {_HOLDS_PERIOD_START}
            AND (asked.max_tokens IS NULL
                 OR hold.spent_tokens + hold.reserved_tokens + %(tokens)s <= asked.max_tokens)
            AND (asked.max_cost IS NULL
                 OR hold.spent_cost + hold.reserved_cost + %(cost)s <= asked.max_cost) AS fits
        FROM {_HOLD} AS hold JOIN asked ON asked.hold_id = hold.id
        ORDER BY {_LOCK_ORDER}
        FOR NO KEY UPDATE OF hold
    ),
    reserved AS (
        UPDATE {_HOLD} AS hold SET reserved_tokens = hold.reserved_tokens + %(tokens)s,
            reserved_cost = hold.reserved_cost + %(cost)s
        FROM locked
        WHERE hold.id = locked.id
          AND (SELECT COUNT(*) FILTER (WHERE fits) = {count} FROM locked)
        RETURNING hold.id
    )
    INSERT INTO {_RESERVATION} (hold_id, run_id, lease_token, tokens, cost, created_at)
    SELECT id, %(run_id)s, %(token)s, %(tokens)s, %(cost)s, statement_timestamp() FROM reserved
    RETURNING id
"""


_RESERVE = {count: _reserve_sql(count) for count in (1, 2)}


@dataclass(frozen=True)
class Held:
    """A hold row as a refused reservation read it."""

    spent: Spent
    reserved: Spent
    #: Whether the database's clock is still in its period.
    current: bool
    #: Of ``reserved``, the asking attempt's own (a call whose record the
    #: database refused): no other call's settle frees it.
    own: Spent


def reserve(holds: list[tuple[int, Budget]], run_id, token: int, tokens: int, cost) -> bool:
    """Reserve ``tokens`` and ``cost`` for the attempt ``run_id``/``token``
    on every hold of ``holds`` (its id and the budget it keeps) in one
    statement; False: it does not fit on one of them beside what is spent
    and reserved (nothing changed on any)."""
    params = {"tokens": tokens, "cost": Decimal(cost), "run_id": str(run_id), "token": token}
    for index, (hold, budget) in enumerate(holds):
        params |= {
            f"hold_{index}": hold,
            f"max_tokens_{index}": budget.max_tokens,
            f"max_cost_{index}": budget.max_cost,
        }
    with connection.cursor() as cursor:
        cursor.execute(_RESERVE[len(holds)], params)
        return cursor.fetchone() is not None


def held(holds: list[int], run_id, token: int) -> list[Held]:
    """The holds (ids, in this order) as the attempt ``run_id``/``token``
    finds them, in one query."""
    own = (
        "(SELECT COALESCE(SUM({column}), 0) FROM"
        f" {_RESERVATION} WHERE run_id = %(run_id)s AND lease_token = %(token)s"
        " AND hold_id = hold.id)"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, spent_tokens, spent_cost, reserved_tokens, reserved_cost,"
            f" start = {_HOLDS_PERIOD_START}, {own.format(column='tokens')},"
            f" {own.format(column='cost')}"
            f" FROM {_HOLD} AS hold WHERE id = ANY(%(holds)s)",
            {"holds": list(holds), "run_id": str(run_id), "token": token},
        )
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    return [
        Held(Spent(row[0], row[1]), Spent(row[2], row[3]), row[4], Spent(row[5], row[6]))
        for row in (rows[hold] for hold in holds)
    ]


#: The holds ``doomed`` (a CTE of deleted reservations: hold_id, tokens,
#: cost) was on, locked in ``LOCK_ORDER`` before any is changed.
_LOCKED = f"""
    locked AS (
        SELECT hold.id FROM {_HOLD} AS hold WHERE hold.id IN (SELECT hold_id FROM doomed)
        ORDER BY {_LOCK_ORDER}
        FOR NO KEY UPDATE OF hold
    )
"""
#: What ``doomed`` held, summed per hold.
_FREED = """
    (SELECT hold_id, SUM(tokens) AS tokens, SUM(cost) AS cost FROM doomed GROUP BY hold_id)
        AS freed
"""
#: Frees what ``doomed`` held, one UPDATE per hold, once ``locked`` took them.
_FREE = f"""
    UPDATE {_HOLD} AS hold SET reserved_tokens = hold.reserved_tokens - freed.tokens,
        reserved_cost = hold.reserved_cost - freed.cost
    FROM {_FREED}
    WHERE hold.id = freed.hold_id AND (SELECT COUNT(*) FROM locked) > 0
"""


def release(run_id, token: int) -> None:
    """Release every reservation of the attempt ``run_id``/``token``: its
    call failed or was abandoned, or the attempt ends."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH doomed AS (DELETE FROM {_RESERVATION}"
            " WHERE run_id = %s AND lease_token = %s RETURNING hold_id, tokens, cost),"
            f" {_LOCKED} {_FREE}",
            [str(run_id), token],
        )


def release_dead(runs_table: str) -> int:
    """Release the reservations of dead attempts: their run is no longer
    ``running`` under their lease token (the reaper's pass, after it reaped
    the runs whose lease expired). How many it released."""
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH doomed AS (DELETE FROM {_RESERVATION} AS reservation WHERE NOT EXISTS ("
            f" SELECT 1 FROM {runs_table} AS run WHERE run.id = reservation.run_id"
            " AND run.status = 'running' AND run.lease_token = reservation.lease_token)"
            " RETURNING hold_id, tokens, cost),"
            f" {_LOCKED}, freeing AS ({_FREE} RETURNING 1)"
            " SELECT COUNT(*) FROM doomed"
        )
        return cursor.fetchone()[0]


#: Parts of a record's single statement (``runs.transitions.step_journal``)
#: with model turns, once the run's guarded UPDATE (the CTE ``run``)
#: matched: the attempt's reservations go and the turns' reported spend
#: (the ``spend_*`` parameters of ``spend.recording.spend_params``) comes
#: to the hold they were on — or, when a turn's usage went unreported, what
#: was reserved: the most it can have cost (unknown is never 0, G17). No
#: reservation (none was made, or the reaper released it): nothing here
#: changes.
SETTLE_CTES = f"""
    doomed AS (
        DELETE FROM {_RESERVATION} WHERE run_id = %(run_id)s AND lease_token = %(token)s
          AND EXISTS (SELECT 1 FROM run)
        RETURNING hold_id, tokens, cost
    ),
    {_LOCKED},
    settled AS (
        UPDATE {_HOLD} AS hold SET reserved_tokens = hold.reserved_tokens - freed.tokens,
            reserved_cost = hold.reserved_cost - freed.cost,
            spent_tokens = hold.spent_tokens + CASE WHEN %(spend_unreported_turns)s > 0
                THEN freed.tokens ELSE %(spend_input_tokens)s + %(spend_output_tokens)s END,
            spent_cost = hold.spent_cost + CASE WHEN %(spend_unreported_turns)s > 0
                THEN freed.cost ELSE %(spend_cost)s END
        FROM {_FREED}
        WHERE hold.id = freed.hold_id AND (SELECT COUNT(*) FROM locked) > 0
        RETURNING 1
    )
"""


def settle(run_id, token: int, spend) -> None:
    """``SETTLE_CTES`` for a record made through the ORM (a park for
    approval), inside the transaction whose guarded UPDATE recorded
    ``spend`` (a ``spend.recording.TurnsSpend``)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH run AS (SELECT 1), {SETTLE_CTES} SELECT 1",
            {
                "run_id": str(run_id),
                "token": token,
                "spend_input_tokens": spend.input_tokens,
                "spend_output_tokens": spend.output_tokens,
                "spend_cost": spend.cost,
                "spend_unreported_turns": spend.unreported_turns,
            },
        )
