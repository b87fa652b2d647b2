"""A rerun's creation (G20): the new run, its copy of the original's journal
before the chosen turn, and the operator steps on both, in one transaction.

The original is guarded by what its verdict was made on (ended, the same
step count): of two concurrent reruns, or a rerun and a requeue, of one run
the one that comes second matches nothing.
"""

from django.db.models import F

from runs.models import AgentRun, RunStep
from runs.transitions._common import _append_step, _log_change, db_time, reaching_disk
from runs.vocabulary import RunMode, RunStatus


def create_rerun(
    of_run_id,
    new_id,
    *,
    seen_step_count: int,
    from_sequence: int,
    request: dict,
    prompt: str,
    steps: list[dict],
    original_step: dict,
    submitted_by,
    submitted_via: str,
    agent_version=None,
) -> AgentRun | None:
    """Store a ``queued`` run ``new_id`` that reruns ``of_run_id`` from its step
    ``from_sequence``: ``steps`` are its first steps (the operator step
    naming the original, then the copied journal), unnumbered; the
    original gets ``original_step``, to which the new run's id is added.
    None if the original changed since it was seen. The caller runs this in
    a transaction and dispatches the run after commit."""
    with reaching_disk():
        seen = AgentRun.objects.filter(
            pk=of_run_id, status__in=RunStatus.terminal(), step_count=seen_step_count
        )
        if not seen.update(step_count=F("step_count") + 1):
            return None
        named = {**original_step["result"], "rerun": str(new_id)}
        sequence, _ = _append_step(of_run_id, None, {**original_step, "result": named})
        run = AgentRun.objects.create(
            id=new_id,
            request=request,
            prompt=prompt,
            status=RunStatus.QUEUED,
            mode=RunMode.QUEUED,
            available_at=db_time(),
            submitted_by=submitted_by,
            submitted_via=submitted_via,
            agent_version=agent_version,
            webhook_url=request.get("webhook", ""),
            rerun_of=of_run_id,
            rerun_from_sequence=from_sequence,
            # The claim numbers its request step after these: an attempt
            # that finds steps before its own replays the journal (G12).
            step_count=len(steps),
        )
        RunStep.objects.bulk_create(
            RunStep(run_id=new_id, sequence=number, lease_token=0, **step)
            for number, step in enumerate(steps, start=1)
        )
    _log_change("operator_rerun", of_run_id, sequence=sequence, rerun=str(new_id))
    return run
