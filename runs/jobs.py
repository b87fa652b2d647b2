"""The RQ job functions, and what a worker loads for them once.

``execute_run_job`` never raises for a run's outcome: the run row holds the
outcome, and RQ must not retry or record a failure of its own."""

import logging

from django.db import close_old_connections, connection

logger = logging.getLogger(__name__)


def execute_run_job(run_id: str) -> None:
    from runs.runtime import run_queued

    close_old_connections()
    # No ``SELECT 1`` health check (CONN_HEALTH_CHECKS) on a kept connection:
    # the job's first statement is the claim, and a claim that fails on a dead
    # connection drops it and claims on a new one (transitions.claim). The
    # check would add a round trip to every job.
    connection.health_check_done = True
    try:
        run_queued(run_id)
    except Exception:
        # Only infrastructure failures reach here (the database away at claim
        # time, say); the run row is unchanged and recovery is the reaper's.
        logger.exception("run=%s job could not execute the run", run_id)
    finally:
        close_old_connections()


def load_for_runs() -> None:
    """Load, once per worker process, what every run needs: the runtime's
    modules, the tools, and (the openai provider configured) its SDK and
    client. The forking worker does it before its first fork, so a work
    horse inherits them instead of importing them again for its one run:
    that was most of the CPU a real run cost. Opens no connection."""
    from runs import runtime  # noqa: F401  (the module graph a run executes)
    from runs.providers.openai_chat import OpenAIChatProvider, built_client
    from tools.registry import get_registry

    loaded = [f"the runtime and {len(get_registry().names())} tools"]
    if OpenAIChatProvider.configuration_problem() is None:
        built_client()
        loaded.append("the openai SDK and client")
    logger.info("loaded for runs before any job: %s", ", ".join(loaded))


def reap_job() -> str:
    """The reaper as a periodic RQ job (see ``runs/cron.py``)."""
    from runs.reaper import reap_stale_runs

    close_old_connections()
    try:
        return reap_stale_runs().summary()
    finally:
        close_old_connections()
