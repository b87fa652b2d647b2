"""Whether the processes that move runs are alive, for the overview.

- The reaper's last pass (with Redis: ``rqcron runs.cron``), or, in the
  embedded default, the embedded worker's (its passes are the worker's and
  the reaper's), from ``runs.models.last_passes.LastPass``.
- With Redis, RQ's own worker registry: each worker serving the runs'
  queue and its last heartbeat, as RQ keeps them.

Alive means seen within a bound: three intervals of the process, and never
less than ``ALIVE_FLOOR_SECONDS`` (a slow pass, a pause, is not an
outage). An RQ worker is listed for as long as RQ keeps its key, which
expires ``worker_ttl + 60`` seconds after its last heartbeat (an idle
forking worker sends one every ``worker_ttl - 15``); past that RQ drops it
and so does this page.

Redis is asked with a client of its own — one attempt, one second to
connect and to answer — so a Redis that is down or hangs costs the page at
most about a second and shows "Redis unreachable", never an error page.
"""

import functools
import logging
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from redis import Redis, RedisError
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq import Queue, Worker
from rq.defaults import DEFAULT_WORKER_TTL

from runs.models.last_passes import EMBEDDED_WORKER, REAPER, LastPass

logger = logging.getLogger(__name__)

ALIVE_FACTOR = 3
ALIVE_FLOOR_SECONDS = 30
#: RQ's own bound: a worker's key expires this long after its last heartbeat.
RQ_WORKER_BOUND_SECONDS = DEFAULT_WORKER_TTL + 60
#: Workers listed by name; the rest are counted.
WORKERS_SHOWN = 20

#: What each recorded pass is, in the page's words.
PROCESSES = {
    REAPER: "Reaper (rqcron runs.cron)",
    EMBEDDED_WORKER: "Embedded worker (runs and the reaper, manage.py embedded_worker)",
}


@dataclass(frozen=True)
class Sign:
    """One process's last sign of life, as a line of the page."""

    what: str
    #: ``host:pid`` or RQ's worker name; "" if never seen.
    process: str
    seen_at: datetime | None
    seconds_ago: float | None
    alive: bool
    #: Within how many seconds it counts as alive.
    bound_seconds: float
    #: An RQ worker's state ("idle", "busy", ...).
    state: str = ""

    @property
    def ago(self) -> str:
        """How long ago it was seen: "4 s", "3 min", "2 h 5 min", "3 days"."""
        seconds = round(self.seconds_ago or 0)
        if seconds < 120:
            return f"{seconds} s"
        if seconds < 7200:
            return f"{seconds // 60} min"
        if seconds < 172800:
            return f"{seconds // 3600} h {seconds % 3600 // 60} min"
        return f"{seconds // 86400} days"


def liveness(now: datetime) -> dict:
    """The reaper's (or embedded worker's) sign, and with Redis the workers'."""
    expected = REAPER if settings.REDIS_URL else EMBEDDED_WORKER
    recorded = LastPass.objects.filter(name=expected).first()
    context = {"passes": [_pass_sign(expected, recorded, now)], "redis": bool(settings.REDIS_URL)}
    if settings.REDIS_URL:
        context.update(_rq_workers(now))
    return context


def _pass_sign(name: str, recorded: LastPass | None, now: datetime) -> Sign:
    if recorded is None:
        bound = ALIVE_FLOOR_SECONDS
        return Sign(PROCESSES[name], "", None, None, False, bound)
    bound = max(ALIVE_FACTOR * recorded.every_seconds, ALIVE_FLOOR_SECONDS)
    return _sign(PROCESSES[name], recorded.process, recorded.at, now, bound)


def _sign(what, process, seen_at, now, bound, state="") -> Sign:
    ago = max((now - seen_at).total_seconds(), 0.0)
    return Sign(what, process, seen_at, ago, ago <= bound, bound, state)


@functools.cache
def _redis(url: str) -> Redis:
    return Redis.from_url(
        url, socket_connect_timeout=1, socket_timeout=1, retry=Retry(NoBackoff(), 0)
    )


def _rq_workers(now: datetime) -> dict:
    try:
        connection = _redis(settings.REDIS_URL)
        queue = Queue(settings.NRLLM_QUEUE_NAME, connection=connection)
        workers = sorted(Worker.all(queue=queue), key=lambda worker: worker.name)
    except (RedisError, OSError) as error:
        return {"redis_error": f"Redis unreachable ({type(error).__name__})", "workers": []}
    except Exception as error:  # noqa: BLE001 - the page must not depend on Redis at all
        # A malformed REDIS_URL (ValueError), a worker hash RQ cannot read:
        # the runs fail dispatch_failed then, and this page is where it shows.
        logger.exception("overview: RQ's workers could not be read")
        return {"redis_error": f"Redis unusable ({type(error).__name__})", "workers": []}
    signs = [
        _sign(
            "RQ worker",
            worker.name,
            worker.last_heartbeat,
            now,
            RQ_WORKER_BOUND_SECONDS,
            state=str(worker.get_state()),
        )
        if worker.last_heartbeat
        else Sign("RQ worker", worker.name, None, None, False, RQ_WORKER_BOUND_SECONDS)
        for worker in workers
    ]
    return {
        "redis_error": "",
        "workers": signs[:WORKERS_SHOWN],
        "workers_total": len(signs),
        "workers_alive": sum(sign.alive for sign in signs),
        "more_workers": max(len(signs) - WORKERS_SHOWN, 0),
    }
