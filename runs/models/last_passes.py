"""The last pass of each periodic process nothing else records: the reaper
(``rqcron runs.cron``, every ``NRLLM_REAPER_INTERVAL_SECONDS``) and, in the
embedded default, ``manage.py embedded_worker`` (the worker and the reaper
in one loop). Without it the console could not tell a reaper that stopped
from one with nothing to do: both leave the runs alone.

One row per process kind, not per process: a pass overwrites it (a
conditional UPDATE, at most one write every ``WRITE_EVERY_SECONDS``), so the
table never grows and a pass costs one statement. Time is the database's,
as every lease's. RQ's workers are not here: RQ keeps their heartbeats in
Redis, and the console reads them there.

The model lives in a module of its own, re-exported by ``runs.models``
where Django looks for it.
"""

from django.db import models

#: Rows, by ``name``.
REAPER = "reaper"
EMBEDDED_WORKER = "embedded_worker"

#: A pass rewrites its row only if the row is older than this: the
#: embedded worker passes every second, and one write a second on SQLite
#: (a commit waits for the disk) is a cost for nothing the page can show.
WRITE_EVERY_SECONDS = 5


class LastPass(models.Model):
    """When a periodic process last completed a pass, and which one did."""

    #: ``REAPER`` or ``EMBEDDED_WORKER``.
    name = models.CharField(max_length=32, primary_key=True)
    #: The database's clock at the pass (``as_of`` for a test's pass).
    at = models.DateTimeField()
    #: ``host:pid`` of the process that made it.
    process = models.CharField(max_length=255)
    #: How often it passes: the console calls it alive within three of these.
    every_seconds = models.FloatField()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name}: {self.at:%Y-%m-%d %H:%M:%S} by {self.process}"
