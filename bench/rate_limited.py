"""The real workload against a provider's limit (#42 item 4): concurrent
workers whose runs want far more requests than the model's limit lets
through, a shared rate limit (``NRLLM_PROVIDER_RATE_LIMITS``) at that same
limit, and the model server refusing past it with 429 (``bench.model_server``
with ``RPM``).

Measured: the rate the server answered, from the first request past the
first second's burst to the last, against the limit (held within 5 %); the
429s against every request (at most 1 %); every run completed (the round
raises otherwise).
"""

import json

from bench.model_latency import CONCURRENT_WORKER, model_latency_round

#: The issue's targets: the rate within 5 % of the limit, 429s at most 1 %.
RATE_WITHIN = 0.05
REFUSED_AT_MOST = 0.01


def rate_limited_figure(
    worker_env: dict, processes: int, concurrency: int, per_minute: int, runs: int
) -> dict:
    """``runs`` two-turn runs on ``processes`` concurrent workers of
    ``concurrency`` slots, a model answering in 1 s, limited to ``per_minute``
    requests a minute both by the server and by the shared limit."""
    figure = model_latency_round(
        worker_env,
        worker_class=CONCURRENT_WORKER,
        processes=processes,
        latency=1.0,
        runs=runs,
        concurrency=concurrency,
        env={
            "NRLLM_WORKER_CONCURRENCY": str(concurrency),
            "DATABASE_POOL_MAX_SIZE": str(max(4, concurrency // 5)),
            "DATABASE_CONN_MAX_AGE": "0",
            "NRLLM_PROVIDER_RATE_LIMITS": json.dumps(
                {"openai:bench-model": {"requests_per_minute": per_minute}}
            ),
            # A limit far below the demand: a run may wait for most of the round.
            "NRLLM_RATE_LIMIT_MAX_WAIT_SECONDS": "3600",
        },
        model_limit=per_minute,
    )
    answered = sorted(figure["served"]["answered"])
    refused = figure["served"]["refused"]
    # Past the first second: the server's bucket and the limiter's both
    # start full, and let a second's worth through at once.
    steady = [at for at in answered if at >= answered[0] + 1]
    seconds = steady[-1] - steady[0] if len(steady) > 1 else 0
    rate = (len(steady) - 1) / seconds if seconds else 0.0
    return {
        "processes": processes,
        "concurrency": concurrency,
        "per_minute": per_minute,
        "runs": runs,
        "completed": figure["completed"],
        "requests": len(answered) + len(refused),
        "refused": len(refused),
        "refused_share": len(refused) / (len(answered) + len(refused)),
        "answered_per_second": rate,
        "limit_per_second": per_minute / 60,
        "rate_to_limit": rate / (per_minute / 60),
        "seconds": seconds,
        "runs_per_second": figure["runs_per_second"],
        "worker_cpu_ms_per_run": figure["worker_cpu_ms_per_run"],
    }


def rate_limited_rows(figure: dict) -> list[dict]:
    """The results table's rows: the rate held, and the 429s."""
    where = (
        f"{figure['processes']} rqworkers ({CONCURRENT_WORKER}, up to {figure['concurrency']} "
        f"runs in flight each), a model answering in 1 s and refusing past "
        f"{figure['per_minute']:,} requests a minute with 429, the same shared limit; "
        f"{figure['runs']} two-turn runs, {figure['completed']} completed"
    )
    return [
        {
            "figure": f"rate held under a provider's limit: {where} (requests answered a "
            f"second over {figure['seconds']:.0f} s, after the first second's burst; "
            f"within {RATE_WITHIN:.0%} of the limit)",
            "value": f"{figure['answered_per_second']:.1f} requests/s",
            "baseline": f"{figure['limit_per_second']:.1f} requests/s limit",
            "ratio": figure["rate_to_limit"],
            "within": f"{1 - RATE_WITHIN:.2f}–{1 + RATE_WITHIN:.2f}",
        },
        {
            "figure": f"429s under a provider's limit ({where}): of "
            f"{figure['requests']:,} requests",
            "value": f"{figure['refused']} ({figure['refused_share']:.2%})",
            "at_most": f"{REFUSED_AT_MOST:.0%}",
        },
    ]
