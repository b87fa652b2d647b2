"""``manage.py rqworker-pool``: django-rq's, with ``rqworker``'s check first."""

import importlib

from runs.management.commands.rqworker import refuse_a_non_durable_database

# django-rq's module name has a hyphen: imported by name.
_pool = importlib.import_module("django_rq.management.commands.rqworker-pool")


class Command(_pool.Command):
    def handle(self, *args, **options):
        refuse_a_non_durable_database("rqworker-pool")
        return super().handle(*args, **options)
