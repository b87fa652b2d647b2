"""``manage.py rqworker-pool``: django-rq's, with ``rqworker``'s checks first
(the open-files limit its workers inherit included) and its log level."""

import importlib

from django.db import connections

from runs.management.commands.rqworker import (
    hold_open_files_for_the_slots,
    refuse_a_non_durable_database,
    refuse_a_worker_class_without_team_queues,
    verbosity_from_log_level,
)

# django-rq's module name has a hyphen: imported by name.
_pool = importlib.import_module("django_rq.management.commands.rqworker-pool")


def close_pools_before_forking() -> None:
    """The check opened the database's pool (the default on PostgreSQL).
    django-rq closes the connections before it forks the workers, which
    gives them back to the pool; the pool itself would go with every worker:
    its threads do not survive a fork, so a worker's pool never grows past
    the connection it inherited (its runs waited for it in turn, and timed
    out), and that connection would be every worker's. Each worker opens a
    pool of its own instead."""
    for connection in connections.all():
        if connection.settings_dict["OPTIONS"].get("pool"):
            connection.close()
            connection.close_pool()


class Command(_pool.Command):
    def handle(self, *args, **options):
        refuse_a_worker_class_without_team_queues("rqworker-pool", options)
        refuse_a_non_durable_database("rqworker-pool")
        hold_open_files_for_the_slots("rqworker-pool", options)  # each worker's, inherited
        close_pools_before_forking()
        return super().handle(*args, **verbosity_from_log_level(options))
