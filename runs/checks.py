"""System checks of what a deployment names, run by every ``manage.py``
command (``rqworker`` included) before it starts."""

from django.conf import settings
from django.core.checks import Error, register
from django.utils.module_loading import import_string

from runs.workers.team_queues import ServesTeamQueues

#: The tag of the checks a worker's start runs (``rqworker``), beside
#: Django's of the models, the database and the caches.
WORKER_CHECKS = "runs"

#: What to name instead of a worker class that does not serve the teams' queues.
WORKER_CLASSES = (
    "name runs.worker.ConcurrentWorker (the default), runs.worker.Worker or "
    "runs.worker.SimpleWorker, or a subclass of one"
)


def why_not_a_worker_class(name: str) -> str | None:
    """Why the worker class ``name`` may not execute runs, or None if it may.
    A run due now waits on its team's queue (G22): a class that serves only
    the queue it is started on (RQ's own) would leave it there for good."""
    try:
        worker_class = import_string(name)
    except ImportError as error:
        return f"{name} cannot be imported: {error}"
    if isinstance(worker_class, type) and issubclass(worker_class, ServesTeamQueues):
        return None
    return f"{name} does not serve the teams' queues, where runs wait (G22)"


@register(WORKER_CHECKS)
def worker_serves_team_queues(app_configs, **kwargs) -> list[Error]:
    """``NRLLM_WORKER_CLASS``, checked by every command (``rqworker`` refuses
    a ``--worker-class`` the same way)."""
    why = why_not_a_worker_class(settings.RQ.get("WORKER_CLASS", ""))
    if why is None:
        return []
    return [Error(f"NRLLM_WORKER_CLASS={why}", hint=WORKER_CLASSES, id="runs.E002")]
