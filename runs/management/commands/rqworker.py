"""``manage.py rqworker``: django-rq's, but it refuses to start on a database
that cannot make a commit durable (``runs.durability``), naming why: every
run it executed there could run a write twice after a server crash."""

from django.core.management.base import CommandError
from django_rq.management.commands.rqworker import Command as RQWorkerCommand

from runs.durability import refusal


class Command(RQWorkerCommand):
    def handle(self, *args, **options):
        problem = refusal()
        if problem is not None:
            raise CommandError(f"rqworker not started: {problem}")
        return super().handle(*args, **options)
