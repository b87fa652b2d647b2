"""The resume figure: the resumed attempt of a run whose first attempt
recorded its journal and failed, next to a live run of the same steps, both
executed as a worker's job would (``run_queued``), with the statements a
resumed attempt costs."""

import time

from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench.measuring import median_by, steps_request


def _resumable_request(steps: int) -> dict:
    """The live run of ``steps_request("noop_read", steps // 2)`` with a
    scripted auth failure, on the first attempt only, before its answer: that
    attempt records ``steps - 1`` steps (the request, ``steps // 2 - 1``
    no-op read calls and their llm turns) and fails ``not_retryable``; the
    next attempt replays those calls and answers live."""
    turn = {"tool_calls": [{"name": "noop_read", "arguments": {}}]}
    calls = steps // 2 - 1
    turns = [turn] * calls + [{"error": "auth", "attempts": 1}, {"content": "ok"}]
    return {
        "prompt": "bench resume",
        "tools": ["noop_read"],
        "provider": {"kind": "scripted", "turns": turns},
        "max_iterations": steps // 2,
    }


def _queued_run(request: dict):
    """A stored ``queued`` run of ``request``, not yet dispatched: the caller
    executes it with ``run_queued``, as a worker's job would."""
    from runs import transitions
    from runs.runtime.run_request import parse_run_request

    parsed = parse_run_request(request)
    return transitions.create_queued_run(parsed.as_json(), parsed.prompt)


def _requeued_after_failure(steps: int):
    """A run whose first attempt (executed here, untimed) recorded its journal
    and was dead-lettered, put back in the queue by an operator requeue."""
    from runs import transitions
    from runs.models import AgentRun
    from runs.models.vocabulary import StepKind
    from runs.runtime import enqueue

    run = AgentRun.objects.get(pk=enqueue(_resumable_request(steps)).pk)
    assert (run.status, run.termination_reason) == ("failed", "not_retryable"), run.error_message
    requeued = transitions.operator_requeue(
        run.pk,
        seen_status=run.status,
        seen_step_count=run.step_count,
        step={
            "kind": StepKind.OPERATOR,
            "result": {"operator": "bench", "action": "requeue", "note": "bench resume"},
        },
    )
    assert requeued, "the operator requeue did not match"
    return run


def _check_resumed(run_id, replayed_turns: int) -> int:
    """The resumed attempt completed, replayed ``replayed_turns`` turns and
    their tool results, and recorded only its request, one resume step and
    the final answer. Returns the journal steps it replayed."""
    from runs.models import AgentRun

    run = AgentRun.objects.get(pk=run_id)
    assert run.status == "completed", (run.status, run.termination_reason, run.error_message)
    attempt = list(
        run.steps.filter(lease_token=run.lease_token)
        .values_list("kind", "result")
        .order_by("sequence")
    )
    kinds = [kind for kind, _ in attempt]
    assert kinds == ["request", "resume", "llm"], kinds
    assert run.steps.filter(kind="resume").count() == 1
    resume = attempt[1][1]
    assert resume["model_turns"] == resume["tool_results"] == replayed_turns, resume
    return resume["model_turns"] + resume["tool_results"]


def _timed_run_queued(run_id) -> float:
    from runs.runtime import run_queued

    started = time.perf_counter()
    run_queued(run_id)
    return time.perf_counter() - started


def _statements_of_run_queued(run_id) -> int:
    from runs.runtime import run_queued

    with CaptureQueriesContext(connection) as queries:
        run_queued(run_id)
    return len(queries)


def resume_figures(steps: int, rounds: int) -> dict:
    """Resuming a run of ``steps`` recorded steps next to executing it live.

    Each round, in turn: a live run of ``steps`` no-op read steps, then the
    resumed attempt of a run whose first attempt recorded the same calls
    (claim, one journal read, the resume step, the live final answer); both
    timed from ``run_queued`` to its return, as a worker's job. Reported: the
    round with the median ratio resumed / live, and every round's values.
    Statements are counted in a separate, untimed pass first (which also
    warms up), at ``steps`` and at a tenth of it, so a count that grows with
    the journal shows."""
    from runs.models import AgentRun

    replayed_turns = steps // 2 - 1
    statements = {}
    for size in sorted({steps, max(steps // 10, 4)}):
        run = _requeued_after_failure(size)
        count = _statements_of_run_queued(run.pk)
        statements[_check_resumed(run.pk, size // 2 - 1)] = count
    live = _queued_run(steps_request("noop_read", steps // 2))
    live_statements = _statements_of_run_queued(live.pk)
    live_steps = AgentRun.objects.get(pk=live.pk).step_count

    measured = []
    for _ in range(rounds):
        resumable = _requeued_after_failure(steps)
        live = _queued_run(steps_request("noop_read", steps // 2))
        live_seconds = _timed_run_queued(live.pk)
        resumed_seconds = _timed_run_queued(resumable.pk)
        live = AgentRun.objects.get(pk=live.pk)
        assert live.status == "completed", live.error_message
        replayed = _check_resumed(resumable.pk, replayed_turns)
        measured.append(
            {
                "live_steps": live.step_count,
                "live_seconds": live_seconds,
                "live_steps_per_second": live.step_count / live_seconds,
                "replayed_steps": replayed,
                "resumed_seconds": resumed_seconds,
                "resumed_ms_per_replayed_step": resumed_seconds * 1000 / replayed,
                "ratio": resumed_seconds / live_seconds,
            }
        )
    middle = median_by(measured, "ratio")
    return {
        **middle,
        "rounds": [round(m["ratio"], 3) for m in measured],
        "live_rounds_steps_per_second": [round(m["live_steps_per_second"]) for m in measured],
        "resumed_rounds_ms": [round(m["resumed_seconds"] * 1000, 2) for m in measured],
        "resumed_rounds_ms_per_replayed_step": [
            round(m["resumed_ms_per_replayed_step"], 4) for m in measured
        ],
        "statements_per_resumed_attempt": statements[middle["replayed_steps"]],
        # Replayed steps → statements of the resumed attempt (a constant).
        "statements_per_resumed_attempt_by_replayed_steps": statements,
        "statements_per_live_step": live_statements / live_steps,
    }
