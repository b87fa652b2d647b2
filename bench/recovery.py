"""How long a dead worker's runs wait (G16): from a SIGKILL to each of its
runs claimed again by another worker, with the shipped defaults.

A ``runs.worker.ConcurrentWorker`` holds ``runs`` runs, each waiting on a
model that takes a minute; the reaper runs as production runs it (``manage.py
rqcron runs.cron``, every ``NRLLM_REAPER_INTERVAL_SECONDS``); a second
worker waits for work. The first worker is SIGKILLed; the clock stops for a
run when its lease token grows (another attempt claimed it). Nothing of the
lease, the heartbeat or the reaper is set by the full bench: what is shipped
is measured (the smoke bench shortens them, to be quick).
"""

import os
import signal
import statistics
import subprocess
import sys
import time

from django.conf import settings

from bench.measuring import ROOT
from bench.model_latency import ModelServer, wait_for_workers

#: The issue's target (#28): a killed worker's runs claimed again within it.
RECLAIMED_WITHIN_SECONDS = 60


def recovery_after_sigkill(
    worker_env: dict, runs: int, *, overrides: dict | None = None, model_seconds: float = 60
) -> dict:
    """``overrides`` (the smoke bench's, to be quick) replace shipped
    settings; the full bench passes none. The model takes ``model_seconds``
    a turn: the runs are mid-call when their worker dies."""
    from runs.models import AgentRun
    from runs.runtime import enqueue

    model = ModelServer(model_seconds)
    settings.NRLLM_OPENAI_BASE_URL, settings.NRLLM_OPENAI_API_KEY = model.base_url, "sk-bench"
    env = {
        **worker_env,
        "NRLLM_WORKER_CLASS": "runs.worker.ConcurrentWorker",
        "NRLLM_OPENAI_BASE_URL": model.base_url,
        "NRLLM_OPENAI_API_KEY": "sk-bench",
        "DATABASE_POOL_MAX_SIZE": "10",
        "DATABASE_CONN_MAX_AGE": "0",
        # Stopping the survivor at the end need not wait for its runs.
        "NRLLM_WORKER_DRAIN_SECONDS": "0",
    }
    for name in ("NRLLM_LEASE_SECONDS", "NRLLM_REAPER_INTERVAL_SECONDS"):
        env.pop(name, None)  # the shipped defaults, unless overridden
    env.update(overrides or {})
    lease = int(env.get("NRLLM_LEASE_SECONDS", settings.NRLLM_LEASE_SECONDS))
    interval = int(env.get("NRLLM_REAPER_INTERVAL_SECONDS", settings.NRLLM_REAPER_INTERVAL_SECONDS))

    def start(*command):
        return subprocess.Popen(
            [sys.executable, "manage.py", *command],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    victim = start("rqworker", settings.NRLLM_QUEUE_NAME)
    reaper = start("rqcron", "runs.cron")
    survivor = None
    try:
        wait_for_workers(1)
        prompt = f"recovery {time.time()}"
        request = {
            "prompt": prompt,
            "tools": ["read_note"],
            "provider": {"kind": "openai", "model": "bench-model"},
        }
        mine = AgentRun.objects.filter(prompt=prompt)
        ids = [enqueue(request).pk for _ in range(runs)]
        deadline = time.monotonic() + 120
        while mine.filter(status="running", lease_token=1).count() < runs:
            if time.monotonic() > deadline:
                raise RuntimeError("the runs did not all start on the first worker")
            time.sleep(0.2)
        # Mid-call (the model takes model_seconds), the lease kept meanwhile.
        time.sleep(3)
        survivor = start("rqworker", settings.NRLLM_QUEUE_NAME)
        wait_for_workers(2)
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        victim.wait()
        reclaimed: dict = {}
        while len(reclaimed) < runs and time.monotonic() - killed_at < 180:
            for run_id in mine.filter(lease_token__gt=1).values_list("pk", flat=True):
                reclaimed.setdefault(run_id, time.monotonic() - killed_at)
            time.sleep(0.2)
    finally:
        for process in (victim, reaper, survivor):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(timeout=60)
        model.stop()
    if len(reclaimed) < runs:
        raise RuntimeError(f"{runs - len(reclaimed)} of {runs} runs not claimed again in 180 s")
    seconds = [reclaimed[run_id] for run_id in ids]
    return {
        "runs": runs,
        "shipped_defaults": not overrides,
        "lease_seconds": lease,
        "reaper_interval_seconds": interval,
        "first_seconds": min(seconds),
        "median_seconds": statistics.median(seconds),
        "last_seconds": max(seconds),
    }


def recovery_row(recovery: dict) -> dict:
    return {
        "figure": f"a killed worker's {recovery['runs']} runs in flight, SIGKILL to claimed "
        f"again by another worker "
        f"({'shipped defaults' if recovery['shipped_defaults'] else 'smoke settings'}: "
        f"lease {recovery['lease_seconds']} s, "
        f"reaper every {recovery['reaper_interval_seconds']} s; first "
        f"{recovery['first_seconds']:.1f} s, median {recovery['median_seconds']:.1f} s)",
        "value": f"{recovery['last_seconds']:.1f} s",
        "at_most": f"{RECLAIMED_WITHIN_SECONDS} s",
    }
