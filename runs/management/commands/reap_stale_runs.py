"""``manage.py reap_stale_runs``: one reaper pass, from a shell or a schedule."""

import time
from datetime import datetime

from django.core.management.base import BaseCommand, CommandError

from runs.reaper import reap_stale_runs


def _as_of(value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise CommandError(f"--as-of {value!r} is not an ISO 8601 date-time") from None
    if moment.tzinfo is None:
        raise CommandError(f"--as-of {value!r} needs a time zone, e.g. 2026-01-01T00:00:00+00:00")
    return moment


class Command(BaseCommand):
    help = (
        "Reap runs whose lease expired (requeue or dead-letter) and re-dispatch queued "
        "runs whose job was lost. Once, or every SECONDS with --loop."
    )

    def add_arguments(self, parser):
        parser.add_argument("--loop", type=float, metavar="SECONDS", help="repeat every SECONDS")
        parser.add_argument("--as-of", type=_as_of, help="treat this time as now (testing)")

    def handle(self, *args, loop=None, as_of=None, **options):
        if loop is not None and loop <= 0:
            raise CommandError("--loop needs a positive number of seconds")
        while True:
            report = reap_stale_runs(as_of=as_of)
            self.stdout.write(f"reaper pass: {report.summary()}")
            self.stdout.flush()
            if loop is None:
                return
            time.sleep(loop)
