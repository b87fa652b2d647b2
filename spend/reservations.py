"""Reservations before model calls: a submitter's budget is never overshot
(G21).

Before a model call its attempt reserves the call's largest possible cost
(``spend.call_size``: the prompt's UTF-8 bytes, an upper bound of its
tokens for a byte-level tokenizer, plus the completion's ``max_tokens``) against
its submitter's period in one guarded UPDATE of the period's ``SpendHold``:
it matches only while ``spent + reserved + this`` stays within the budget,
and a row lock orders concurrent reservations, so two runs cannot both take
the last room. The statement that records the turn settles it (``SETTLE_CTES``
in the record's single statement: the reservation goes, the reported spend
comes). A failed or abandoned call's attempt releases it (``release``); a
dead attempt's is released by the reaper (``release_dead``).

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


#: The first day of the period the database's clock is in, for a hold's
#: ``period`` (a column or a parameter).
_CURRENT_START = (
    "CASE {period} WHEN 'month' THEN date_trunc('month', statement_timestamp() AT TIME ZONE 'UTC')"
    "::date ELSE (statement_timestamp() AT TIME ZONE 'UTC')::date END"
)


def hold_for(submitter: int, budget: Budget) -> int:
    """The id of the submitter's ``SpendHold`` for the period the database's
    clock is in (not the claim's: an attempt's calls after midnight are the
    new day's), made from the period's ``DailySpend`` if it is the first,
    and caught up with it if not: turns recorded with no reservation to
    settle (an attempt claimed while the submitter had no budget) are in
    the period's ``DailySpend`` alone. Never lowered: a settle adds to both."""
    start = _CURRENT_START.format(period="%(period)s::text")
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {_HOLD} (submitter, period, start, spent_tokens, spent_cost,"
            " reserved_tokens, reserved_cost)"
            f" SELECT %(submitter)s, %(period)s::text, {start},"
            " COALESCE(SUM(input_tokens + output_tokens), 0), COALESCE(SUM(cost), 0), 0, 0"
            f" FROM {_DAILY} WHERE submitter = %(submitter)s AND day >= {start}"
            " ON CONFLICT (submitter, period, start) DO UPDATE SET"
            f" spent_tokens = GREATEST({_HOLD}.spent_tokens, EXCLUDED.spent_tokens),"
            f" spent_cost = GREATEST({_HOLD}.spent_cost, EXCLUDED.spent_cost)"
            " RETURNING id",
            {"submitter": submitter, "period": budget.period},
        )
        return cursor.fetchone()[0]


#: ``_CURRENT_START`` of a hold row: a reservation is made only in the
#: period the database's clock is in.
_HOLDS_PERIOD_START = _CURRENT_START.format(period="period")

_RESERVE = f"""
    WITH hold AS (
        UPDATE {_HOLD} SET reserved_tokens = reserved_tokens + %(tokens)s,
            reserved_cost = reserved_cost + %(cost)s
        WHERE id = %(hold)s AND start = {_HOLDS_PERIOD_START}
          AND (%(max_tokens)s::bigint IS NULL
               OR spent_tokens + reserved_tokens + %(tokens)s <= %(max_tokens)s::bigint)
          AND (%(max_cost)s::numeric IS NULL
               OR spent_cost + reserved_cost + %(cost)s <= %(max_cost)s::numeric)
        RETURNING id
    )
    INSERT INTO {_RESERVATION} (hold_id, run_id, lease_token, tokens, cost, created_at)
    SELECT id, %(run_id)s, %(token)s, %(tokens)s, %(cost)s, statement_timestamp() FROM hold
    RETURNING id
"""


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


def reserve(hold: int, budget: Budget, run_id, token: int, tokens: int, cost: Decimal) -> bool:
    """Reserve ``tokens`` and ``cost`` for the attempt ``run_id``/``token``
    in one statement; False: it does not fit beside what is spent and
    reserved (nothing changed)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _RESERVE,
            {
                "hold": hold,
                "tokens": tokens,
                "cost": cost,
                "max_tokens": budget.max_tokens,
                "max_cost": budget.max_cost,
                "run_id": str(run_id),
                "token": token,
            },
        )
        return cursor.fetchone() is not None


def held(hold: int, run_id, token: int) -> Held:
    """The hold as the attempt ``run_id``/``token`` finds it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT spent_tokens, spent_cost, reserved_tokens, reserved_cost,"
            f" start = {_HOLDS_PERIOD_START},"
            " (SELECT COALESCE(SUM(tokens), 0) FROM"
            f" {_RESERVATION} WHERE run_id = %(run_id)s AND lease_token = %(token)s),"
            " (SELECT COALESCE(SUM(cost), 0) FROM"
            f" {_RESERVATION} WHERE run_id = %(run_id)s AND lease_token = %(token)s)"
            f" FROM {_HOLD} WHERE id = %(hold)s",
            {"hold": hold, "run_id": str(run_id), "token": token},
        )
        row = cursor.fetchone()
    return Held(Spent(row[0], row[1]), Spent(row[2], row[3]), row[4], Spent(row[5], row[6]))


#: Frees what ``doomed`` (a CTE of deleted reservations: hold_id, tokens,
#: cost) held, one UPDATE per hold.
_FREE = f"""
    UPDATE {_HOLD} AS hold SET reserved_tokens = hold.reserved_tokens - freed.tokens,
        reserved_cost = hold.reserved_cost - freed.cost
    FROM (SELECT hold_id, SUM(tokens) AS tokens, SUM(cost) AS cost FROM doomed GROUP BY hold_id)
        AS freed
    WHERE hold.id = freed.hold_id
"""


def release(run_id, token: int) -> None:
    """Release every reservation of the attempt ``run_id``/``token``: its
    call failed or was abandoned, or the attempt ends."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH doomed AS (DELETE FROM {_RESERVATION}"
            " WHERE run_id = %s AND lease_token = %s RETURNING hold_id, tokens, cost)"
            f" {_FREE}",
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
            f" freeing AS ({_FREE} RETURNING 1)"
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
    settled AS (
        UPDATE {_HOLD} AS hold SET reserved_tokens = hold.reserved_tokens - freed.tokens,
            reserved_cost = hold.reserved_cost - freed.cost,
            spent_tokens = hold.spent_tokens + CASE WHEN %(spend_unreported_turns)s > 0
                THEN freed.tokens ELSE %(spend_input_tokens)s + %(spend_output_tokens)s END,
            spent_cost = hold.spent_cost + CASE WHEN %(spend_unreported_turns)s > 0
                THEN freed.cost ELSE %(spend_cost)s END
        FROM (SELECT hold_id, SUM(tokens) AS tokens, SUM(cost) AS cost FROM doomed
              GROUP BY hold_id) AS freed
        WHERE hold.id = freed.hold_id
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
