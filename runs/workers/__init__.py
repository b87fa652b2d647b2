"""The processes that run runs: the concurrent worker (many runs a process,
a thread each), the embedded worker (the default without Redis), the run
threads both use, and how they wait out Redis and schedule the reaper.
Deployments name ``runs.worker``, ``runs.jobs`` and ``runs.cron``, which stay
where they were and lean on this package."""
