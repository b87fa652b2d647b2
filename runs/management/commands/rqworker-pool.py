"""``manage.py rqworker-pool``: django-rq's, with ``rqworker``'s check first
and its log level."""

import importlib

from runs.management.commands.rqworker import (
    refuse_a_non_durable_database,
    verbosity_from_log_level,
)

# django-rq's module name has a hyphen: imported by name.
_pool = importlib.import_module("django_rq.management.commands.rqworker-pool")


class Command(_pool.Command):
    def handle(self, *args, **options):
        refuse_a_non_durable_database("rqworker-pool")
        return super().handle(*args, **verbosity_from_log_level(options))
