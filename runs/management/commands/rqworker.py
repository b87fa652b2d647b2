"""``manage.py rqworker``: django-rq's, but it refuses to start on a database
that cannot make a commit durable (``ground.durability``), naming why: every
run it executed there could run a write twice after a server crash; and with
a ``--worker-class`` that does not serve the teams' queues (``runs.checks``);
a concurrent worker raises its open-files limit to what its slots hold, or
refuses naming both (``runs.workers.open_files``).
RQ's own log lines follow ``LOG_LEVEL`` as every other logger does."""

import logging

from django.conf import settings
from django.core.checks import Tags
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError
from django.utils.module_loading import import_string
from django_rq.management.commands.rqworker import Command as RQWorkerCommand

from ground.durability import refusal
from runs.checks import WORKER_CHECKS, WORKER_CLASSES, why_not_a_worker_class
from runs.workers.concurrent import ConcurrentWorker
from runs.workers.open_files import hold_open_files


def refuse_a_non_durable_database(command: str) -> None:
    """Raise ``CommandError`` naming why, if the database cannot keep commits."""
    problem = refusal()
    if problem is not None:
        raise CommandError(f"{command} not started: {problem}")


def refuse_a_worker_class_without_team_queues(command: str, options: dict) -> None:
    """Raise ``CommandError`` naming why, if ``--worker-class`` names a class
    that would leave the runs on their teams' queues (the setting's class is
    the system checks')."""
    name = options.get("worker_class")
    why = why_not_a_worker_class(name) if name else None
    if why is not None:
        raise CommandError(f"{command} not started: --worker-class {why}; {WORKER_CLASSES}")


def hold_open_files_for_the_slots(command: str, options: dict) -> None:
    """A concurrent worker's slots each hold connections for their whole
    calls: the process's open-files limit is raised to what they need, or
    ``CommandError`` names why not (``runs.workers.open_files``)."""
    try:
        worker_class = import_string(options.get("worker_class") or settings.RQ["WORKER_CLASS"])
    except ImportError:
        return  # refused by the system checks, with the reason (runs.E002)
    if not (isinstance(worker_class, type) and issubclass(worker_class, ConcurrentWorker)):
        return  # a run at a time
    try:
        hold_open_files(settings.NRLLM_WORKER_CONCURRENCY)
    except ImproperlyConfigured as error:
        raise CommandError(f"{command} not started: {error}") from None


def verbosity_from_log_level(options: dict) -> dict:
    """django-rq sets RQ's worker logger from ``-v`` alone (1: INFO, a line
    or two for every job). Left at its default, ``-v`` follows ``LOG_LEVEL``
    instead: WARNING or above quiets RQ as it quiets the rest, DEBUG is
    ``-v 2``. An explicit ``-v 0`` or ``-v 2`` wins."""
    if options.get("verbosity") != 1:
        return options
    level = logging.getLevelName(str(settings.LOGGING["root"]["level"]).upper())
    if not isinstance(level, int):
        return options
    if level >= logging.WARNING:
        return {**options, "verbosity": 0}
    if level <= logging.DEBUG:
        return {**options, "verbosity": 2}
    return options


class Command(RQWorkerCommand):
    #: The checks of what a worker stands on: the models, the database, the
    #: caches and what the deployment names for runs (``runs.checks``). Not
    #: the URLs', the admin's, the templates' or the security settings'
    #: (``migrate``, at every deploy, runs them all): a worker serves no
    #: page, and checking the URLs imports the whole URL configuration (the
    #: API, DRF, drf-spectacular), about 0.3 of a start's 1.3 s of CPU, paid
    #: again at each restart. (``rqworker-pool`` runs every check, once for
    #: the workers it forks.)
    requires_system_checks = [Tags.models, Tags.database, Tags.caches, WORKER_CHECKS]

    def handle(self, *args, **options):
        refuse_a_worker_class_without_team_queues("rqworker", options)
        refuse_a_non_durable_database("rqworker")
        hold_open_files_for_the_slots("rqworker", options)
        return super().handle(*args, **verbosity_from_log_level(options))
