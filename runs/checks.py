"""System checks of what a deployment names, run by every ``manage.py``
command (``rqworker`` included) before it starts."""

from django.conf import settings
from django.core.checks import Error, register
from django.utils.module_loading import import_string

from runs.workers.team_queues import ServesTeamQueues


@register()
def worker_serves_team_queues(app_configs, **kwargs) -> list[Error]:
    """A run due now waits on its team's queue (G22): a worker class that
    serves only the queue it is started on (RQ's own) would leave it there."""
    name = settings.RQ.get("WORKER_CLASS", "")
    try:
        worker_class = import_string(name)
    except ImportError as error:
        return [Error(f"NRLLM_WORKER_CLASS={name} cannot be imported: {error}", id="runs.E001")]
    if isinstance(worker_class, type) and issubclass(worker_class, ServesTeamQueues):
        return []
    return [
        Error(
            f"NRLLM_WORKER_CLASS={name} does not serve the teams' queues, where runs wait (G22)",
            hint="name runs.worker.ConcurrentWorker (the default), runs.worker.Worker or "
            "runs.worker.SimpleWorker, or a subclass of one",
            id="runs.E002",
        )
    ]
