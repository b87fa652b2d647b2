"""``manage.py rqworker``: django-rq's, but it refuses to start on a database
that cannot make a commit durable (``nrllm_ops.durability``), naming why: every
run it executed there could run a write twice after a server crash."""

from django.core.management.base import CommandError
from django_rq.management.commands.rqworker import Command as RQWorkerCommand

from nrllm_ops.durability import refusal


def refuse_a_non_durable_database(command: str) -> None:
    """Raise ``CommandError`` naming why, if the database cannot keep commits."""
    problem = refusal()
    if problem is not None:
        raise CommandError(f"{command} not started: {problem}")


class Command(RQWorkerCommand):
    def handle(self, *args, **options):
        refuse_a_non_durable_database("rqworker")
        return super().handle(*args, **options)
