"""The heartbeat's renewals (G16): the keeper thread carries the leases of
the attempts in flight while they wait on a model or a tool, each never
past its operation's deadline and never shortened."""

from django.db import connection
from django.db.models import Case, F, Q, When

from runs.models import AgentRun
from runs.models.vocabulary import RunStatus
from runs.transitions.common import Lease, db_time

#: Elsewhere than PostgreSQL, at most this many renewals in one statement:
#: each costs 9 parameters, and SQLite may allow as few as 999 (Django's
#: ``max_query_params`` says how many this backend takes).
_RENEWALS_PER_STATEMENT = 500
_PARAMETERS_PER_RENEWAL = 9


def keep_leases(renewals: list[tuple[Lease, float]], *, when_left: float) -> int:
    """The keeper's renewal of many attempts' leases in one conditional
    UPDATE (G16): each ``(lease, seconds)`` carries its lease to ``seconds`` from now by the
    database's clock if the run is still that lease's and less than
    ``min(when_left, seconds)`` of it is left; any other row is untouched,
    and no lease is shortened. Returns how many leases it renewed; raises
    what the database raised.

    On PostgreSQL the leases go as arrays, one statement whatever their
    number; elsewhere a term per lease, over as few statements as the
    backend takes (building those cost about a millisecond per lease)."""
    if not renewals:
        return 0
    if connection.vendor == "postgresql":
        return _keep_leases_as_arrays(renewals, when_left)
    most = connection.features.max_query_params
    per_statement = _RENEWALS_PER_STATEMENT
    if most:
        per_statement = max(1, min(per_statement, (most - 1) // _PARAMETERS_PER_RENEWAL))
    renewed = 0
    for start in range(0, len(renewals), per_statement):
        renewed += _keep_leases_term_by_term(renewals[start : start + per_statement], when_left)
    return renewed


def _keep_leases_term_by_term(renewals: list[tuple[Lease, float]], when_left: float) -> int:
    due, expiries = Q(), []
    for lease, seconds in renewals:
        # ``owned_run``'s guard (its status term is shared, below), and
        # less than ``left`` is left, so never shortened.
        guard = Q(
            pk=lease.run_id,
            lease_owner=lease.owner,
            lease_token=lease.token,
            lease_expires_at__lt=db_time(min(when_left, seconds)),
        )
        due |= guard
        # The whole guard again, not the run and token alone: a token a
        # server crash handed out twice (``StepLedger``) names two attempts,
        # and a row matched by one's guard must not get the other's expiry.
        expiries.append(When(guard, then=db_time(seconds)))
    return AgentRun.objects.filter(due, status=RunStatus.RUNNING).update(
        lease_expires_at=Case(*expiries, default=F("lease_expires_at"))
    )


def _keep_leases_as_arrays(renewals: list[tuple[Lease, float]], when_left: float) -> int:
    # A row joins only the renewal whose whole guard (run, owner, token)
    # it matches: an attempt under a token a server crash handed out twice
    # never gets the other's expiry. STATEMENT_TIMESTAMP() is Django's Now()
    # on PostgreSQL, the clock of every other lease statement.
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {AgentRun._meta.db_table} AS run
               SET lease_expires_at =
                   STATEMENT_TIMESTAMP() + make_interval(secs => renewal.seconds)
              FROM unnest(%s::uuid[], %s::text[], %s::integer[], %s::double precision[])
                   AS renewal(run_id, owner, token, seconds)
             WHERE run.id = renewal.run_id
               AND run.lease_owner = renewal.owner
               AND run.lease_token = renewal.token
               AND run.status = %s
               AND run.lease_expires_at
                   < STATEMENT_TIMESTAMP() + make_interval(secs => LEAST(%s, renewal.seconds))
            """,
            [
                [str(lease.run_id) for lease, _ in renewals],
                [lease.owner for lease, _ in renewals],
                [lease.token for lease, _ in renewals],
                [float(seconds) for _, seconds in renewals],
                RunStatus.RUNNING,
                float(when_left),
            ],
        )
        return cursor.rowcount
