"""``manage.py enqueue_run``: store a queued run from a request file."""

from django.core.management.base import BaseCommand, CommandError

from agents.management.commands._request_file import read_request
from agents.starting import enqueue
from runs.runtime.run_request import InvalidRunRequest


class Command(BaseCommand):
    help = (
        "Enqueue a run from a request JSON file (or - for stdin): a whole request, or "
        '{"agent": "<name>", "input": "..."}; prints the run id.'
    )

    def add_arguments(self, parser):
        parser.add_argument("file", help="request JSON file, or - for stdin")

    def handle(self, *args, file, **options):
        request = read_request(file)
        try:
            run = enqueue(request)
        except InvalidRunRequest as error:
            raise CommandError(f"invalid run request: {error}") from None
        self.stdout.write(str(run.pk))
