"""``manage.py prune_runs --older-than 90d``: retention, from a shell or a schedule."""

import re
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from runs.reaper.retention import MAXIMUM_BATCH, MINIMUM_AGE, prune_runs

_AGE = re.compile(r"([0-9]{1,7})([dh])")
#: A hundred years: past that, a cutoff is before the calendar's start.
_LONGEST = timedelta(days=36500)


def _age(value: str) -> timedelta:
    match = _AGE.fullmatch(value.strip())
    age = None
    if match is not None:
        count, unit = int(match[1]), match[2]
        age = timedelta(days=count) if unit == "d" else timedelta(hours=count)
    if age is None or not MINIMUM_AGE <= age <= _LONGEST:
        raise CommandError(
            f"--older-than {value!r}: give a whole number of days or hours, like 90d or "
            f"12h, from 1h to {_LONGEST.days}d"
        )
    return age


class Command(BaseCommand):
    help = (
        "Delete whole runs that ended longer ago than --older-than (their steps, dead "
        "letters and approval requests with them), in batches. A run with an open "
        "question is kept: a write in doubt not reconciled, a dead letter not resolved, "
        "a call waiting for approval. The admin log, reconciliations, the outbox and the "
        "daily spend are kept."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than",
            required=True,
            metavar="AGE",
            help="how long ago a run must have ended: 90d (days) or 12h (hours)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="say what would be deleted; delete nothing"
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=settings.NRLLM_RETENTION_BATCH_SIZE,
            help="runs per transaction (default: NRLLM_RETENTION_BATCH_SIZE, %(default)s)",
        )

    def handle(self, *args, older_than, dry_run, batch_size, **options):
        age = _age(older_than)
        if not 1 <= batch_size <= MAXIMUM_BATCH:
            raise CommandError(f"--batch-size must be from 1 to {MAXIMUM_BATCH}")
        report = prune_runs(timezone.now() - age, batch_size=batch_size, dry_run=dry_run)
        self.stdout.write(report.summary())
