"""Deleting whole runs: the one exception to G11's append-only history.

A run is deleted whole or not at all: its row first, then everything that
belongs to it (steps, dead letters, reconciliations, approval requests),
in one transaction. On PostgreSQL the append-only guard lets a step go only
once its run's row is gone in that transaction (foreign keys are checked at
commit), so no statement can take a step out of a run that stays; Django's
own delete cannot be used there: it deletes a run's steps before the run.
Kept: the admin log, and the outbox (a record of the outside world, which
names a run by id)."""

from django.db import connection, transaction

from runs.models import AgentRun


def delete_whole_runs(run_ids) -> int:
    """Delete the runs ``run_ids`` and all that belongs to them; how many
    runs there were. Which runs may go is the caller's decision."""
    pk = AgentRun._meta.pk
    values = [pk.get_db_prep_value(pk.to_python(run_id), connection) for run_id in run_ids]
    if not values:
        return 0
    marks = ", ".join(["%s"] * len(values))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {AgentRun._meta.db_table} WHERE id IN ({marks})", values)
        deleted = cursor.rowcount
        # Hidden relations too: a foreign key with related_name="+" (the
        # API's Idempotency-Key rows) still holds the run.
        for relation in _belonging_to_a_run():
            cursor.execute(
                f"DELETE FROM {relation.related_model._meta.db_table} "
                f"WHERE {relation.field.column} IN ({marks})",
                values,
            )
    return deleted


def _belonging_to_a_run():
    return [
        field
        for field in AgentRun._meta.get_fields(include_hidden=True)
        if field.auto_created and not field.concrete and (field.one_to_many or field.one_to_one)
    ]
