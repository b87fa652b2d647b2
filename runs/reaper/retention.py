"""Retention: deleting whole runs past their age, the one exception to
G11's append-only history.

A run is deleted whole or not at all: its row first, then everything that
belongs to it (steps, dead letters, approval requests, the API's
Idempotency-Key rows), in one transaction. On PostgreSQL the append-only
guard lets a step go only once its run's row is gone in that transaction
(foreign keys are checked at commit), so no statement can take a step out of
a run that stays; Django's own delete cannot be used there: it deletes a
run's steps before the run.

Kept, for an audit: the admin log (every operator action on the run, with
its note), the write reconciliations (what an operator found about a write
in doubt; they outlive their run), the outbox (a record of the outside
world) and the daily spend (G17's totals).

``prune_runs`` deletes only ended runs with no open question: a write in
doubt (``runs.models.selectors``' one definition, the requeue verdict's too),
a dead letter not resolved, a call waiting for approval, a run-ended
webhook still being retried (G19). It works in batches, each its own short
transaction.
"""

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core.exceptions import ImproperlyConfigured
from django.db import connection, models, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from runs.models import AgentRun, ApprovalRequest, DeadLetter, RunEvent, RunStep
from runs.models.selectors import without_writes_in_doubt, writes_in_doubt
from runs.models.vocabulary import ApprovalStatus, RunStatus

logger = logging.getLogger(__name__)


def delete_whole_runs(run_ids) -> int:
    """Delete the runs ``run_ids`` and all that belongs to them; how many
    runs there were. Which runs may go is the caller's decision."""
    return _delete_whole_runs(run_ids).get(AgentRun._meta.db_table, 0)


def _delete_whole_runs(run_ids) -> dict[str, int]:
    """Rows deleted, by table."""
    pk = AgentRun._meta.pk
    values = [pk.get_db_prep_value(pk.to_python(run_id), connection) for run_id in run_ids]
    if not values:
        return {}
    marks = ", ".join(["%s"] * len(values))
    deleted = {}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {AgentRun._meta.db_table} WHERE id IN ({marks})", values)
        deleted[AgentRun._meta.db_table] = cursor.rowcount
        # Hidden relations too: a foreign key with related_name="+" (the
        # API's Idempotency-Key rows) still holds the run.
        for relation in _belonging_to_a_run():
            table = relation.related_model._meta.db_table
            cursor.execute(
                f"DELETE FROM {table} WHERE {relation.field.column} IN ({marks})", values
            )
            deleted[table] = cursor.rowcount
    return deleted


def _belonging_to_a_run():
    """The relations whose rows go with their run (``CASCADE``); those
    declared to outlive it (``DO_NOTHING``: the reconciliations) stay. Any
    other rule is refused rather than guessed at: a ``SET_NULL`` or
    ``PROTECT`` row deleted here would lose what its model promised."""
    relations = [
        relation
        for relation in AgentRun._meta.get_fields(include_hidden=True)
        if relation.auto_created
        and not relation.concrete
        and (relation.one_to_many or relation.one_to_one)
    ]
    unknown = [
        relation
        for relation in relations
        if relation.on_delete not in (models.CASCADE, models.DO_NOTHING)
    ]
    if unknown:
        names = ", ".join(sorted(relation.related_model.__name__ for relation in unknown))
        raise ImproperlyConfigured(f"retention does not know how to delete a run's {names}")
    return [relation for relation in relations if relation.on_delete is models.CASCADE]


#: Why a run past its age is kept: each is a question an operator has not
#: answered yet, and deleting the run would delete the question.
OPEN_QUESTIONS = {
    "write_in_doubt": "writes in doubt",
    "open_dead_letter": "open dead letters",
    "pending_approval": "pending approvals",
    "webhook_due": "run-ended webhooks not yet delivered",
}


def ended_before(cutoff: datetime):
    """Runs that ended before ``cutoff``. A run ends after it is created,
    so ``created_at`` bounds the scan of its index too."""
    return AgentRun.objects.filter(
        status__in=RunStatus.terminal(), created_at__lt=cutoff, finished_at__lt=cutoff
    )


def _open_question(name: str):
    """The condition that a run has the open question ``name``."""
    if name == "open_dead_letter":
        return Exists(DeadLetter.objects.filter(run=OuterRef("pk"), resolved_at__isnull=True))
    if name == "webhook_due":
        # Still being retried (G19): neither delivered nor given up.
        return Exists(
            RunEvent.objects.filter(
                run=OuterRef("pk"), delivered_at__isnull=True, gave_up_at__isnull=True
            )
        )
    return Exists(ApprovalRequest.objects.filter(run=OuterRef("pk"), status=ApprovalStatus.PENDING))


def _count_with_open_question(name: str, runs) -> int:
    """How many of ``runs`` have the open question ``name``."""
    if name == "write_in_doubt":
        return writes_in_doubt(runs).count()
    return runs.filter(_open_question(name)).count()


def prunable(cutoff: datetime):
    """The runs that ended before ``cutoff`` and have no open question.
    Each condition is on the row (a correlated NOT EXISTS through the
    other table's run index), so a batch costs its candidates, not a scan
    of every dead letter or approval; the idempotent writes in doubt are
    the ids one query over the fenced runs finds (``runs.models.selectors``). A
    run that ends after that query ends after ``cutoff``."""
    return (
        without_writes_in_doubt(ended_before(cutoff))
        .exclude(_open_question("open_dead_letter"))
        .exclude(_open_question("pending_approval"))
        .exclude(_open_question("webhook_due"))
    )


@dataclass
class PruneReport:
    cutoff: datetime
    dry_run: bool
    runs: int = 0
    steps: int = 0
    batches: int = 0
    #: Runs ended before the cutoff kept for each open question (a run may
    #: have more than one).
    kept: dict[str, int] = field(default_factory=dict)
    #: The longest batch, in milliseconds: how long its locks were held.
    longest_batch_ms: float = 0.0
    #: Whether a ``deadline`` stopped the pass before the last batch.
    unfinished: bool = False

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        kept = ", ".join(f"{OPEN_QUESTIONS[name]} {count}" for name, count in self.kept.items())
        return (
            f"{verb} {_counted(self.runs, 'run')} ({_counted(self.steps, 'step')}) that ended "
            f"before {self.cutoff.isoformat(timespec='seconds')}"
            + (f" in {_counted(self.batches, 'batch')}" if not self.dry_run else "")
            + f"; kept, with a question open: {kept}"
            + ("; stopped at its deadline, the rest is the next pass's" if self.unfinished else "")
        )


#: A backstop: a run that has just ended is never pruned, whatever asks
#: (an age of 0 from a worker's missing setting, say); its client may not
#: have read its result yet.
MINIMUM_AGE = timedelta(hours=1)
#: A batch binds a parameter per run (PostgreSQL takes at most 65,535).
MAXIMUM_BATCH = 10_000


def _counted(count: int, noun: str) -> str:
    plural = noun + ("es" if noun.endswith("h") else "s")
    return f"{count} {noun if count == 1 else plural}"


def prune_runs(
    cutoff: datetime, *, batch_size: int, dry_run: bool = False, deadline: float | None = None
) -> PruneReport:
    """Delete every run that ``prunable(cutoff)`` holds, oldest first, in
    batches of ``batch_size`` runs, each batch one transaction; with
    ``dry_run``, count them and delete nothing. A ``deadline`` (a
    ``time.monotonic()`` value) stops the pass between two batches."""
    if cutoff > timezone.now() - MINIMUM_AGE:
        raise ValueError(f"retention keeps runs for at least {MINIMUM_AGE}: cutoff {cutoff}")
    if not 1 <= batch_size <= MAXIMUM_BATCH:
        raise ValueError(f"batch_size must be from 1 to {MAXIMUM_BATCH}, not {batch_size}")
    report = PruneReport(cutoff=cutoff, dry_run=dry_run)
    report.kept = {
        name: _count_with_open_question(name, ended_before(cutoff)) for name in OPEN_QUESTIONS
    }
    if dry_run:
        report.runs = prunable(cutoff).count()
        report.steps = RunStep.objects.filter(run__in=prunable(cutoff)).count()
        return report
    after = None
    while True:
        if deadline is not None and time.monotonic() >= deadline:
            report.unfinished = True
            break
        started = time.perf_counter()
        with transaction.atomic():
            batch = _next_batch(cutoff, after, batch_size)
            if not batch:
                break
            deleted = _delete_whole_runs([run_id for run_id, _ in batch])
        report.longest_batch_ms = max(
            report.longest_batch_ms, (time.perf_counter() - started) * 1000
        )
        report.batches += 1
        report.runs += deleted.get(AgentRun._meta.db_table, 0)
        report.steps += deleted.get(RunStep._meta.db_table, 0)
        after = batch[-1][1], batch[-1][0]
    logger.info("prune_runs: %s", report.summary())
    return report


def _next_batch(cutoff: datetime, after, size: int) -> list:
    """The next ``size`` prunable runs after ``after`` (created_at, id),
    oldest first, locked until the batch's transaction ends: ``(id,
    created_at)`` pairs.

    The keyset walks the created_at index once per pass, so runs kept for
    an open question are not scanned again by every batch. The lock, taken
    with the conditions re-checked on the row's newest version, is what
    makes the delete safe against an operator's action in between: a run
    requeued since is no longer ended; one that ended again has a new
    ``finished_at``, past the cutoff (every transition that opens a question
    ends or requeues the run); and what waits for our lock finds the run
    gone, which every transition already treats as a race it lost. Locked
    runs are skipped: the next pass takes them."""
    runs = prunable(cutoff)
    if after is not None:
        created_at, run_id = after
        runs = runs.filter(Q(created_at__gt=created_at) | Q(created_at=created_at, pk__gt=run_id))
    return list(
        runs.select_for_update(skip_locked=True, of=("self",))
        .order_by("created_at", "pk")
        .values_list("pk", "created_at")[:size]
    )
