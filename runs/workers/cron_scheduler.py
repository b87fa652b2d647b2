"""The scheduler ``manage.py rqcron runs.cron`` runs: django-rq's, outliving
a Redis outage.

RQ's cron scheduler enqueues the periodic jobs (the reaper, retention) and
exits on the first Redis error, so a Redis restart stopped the reaper
without a word. This one notices the error (logged once per outage,
``runs.workers.redis_outage``) and tries again after 1 s, doubling up to
``LONGEST_WAIT_SECONDS``. A job not enqueued meanwhile is enqueued as soon
as Redis answers; the scheduler's own record in Redis (its registry entry
and hash, which the queue dashboard lists) is written again by its next
heartbeat, as RQ does when that record expired.
"""

from django_rq.cron import DjangoCronScheduler
from redis import RedisError

from runs.workers.redis_outage import RedisOutage


class OutageProofCronScheduler(DjangoCronScheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.redis_outage = RedisOutage(f"rqcron {self.name}")

    def register_birth(self):
        # Not waited for: the loop's heartbeat registers it again.
        self.redis_outage.tolerate(super().register_birth)

    def enqueue_jobs(self):
        """RQ's; nothing while Redis is away (a job not enqueued stays due)."""
        try:
            return super().enqueue_jobs()
        except RedisError as error:
            self.redis_outage.noticed(error)
            return []

    def save(self, pipeline=None):
        if pipeline is not None:
            return super().save(pipeline)
        self.redis_outage.tolerate(super().save)
        return None

    def heartbeat(self):
        if self.redis_outage.tolerate(super().heartbeat):
            self.redis_outage.over()

    def calculate_sleep_interval(self) -> float:
        """RQ's, until the next job is due; while Redis is away, the
        outage's next wait (a job overdue would otherwise be tried again
        at once, in a busy loop)."""
        if self.redis_outage.away:
            return self.redis_outage.next_wait()
        return super().calculate_sleep_interval()

    def register_death(self, pipeline=None):
        if pipeline is not None:
            return super().register_death(pipeline)
        self.redis_outage.tolerate(super().register_death)
        return None
