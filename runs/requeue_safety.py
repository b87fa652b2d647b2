"""The one function that decides whether an operator may requeue a run (G10).

The admin and the API both call ``requeue_safety`` and show its reason. A
requeued run executes again from the start, so the verdict refuses whenever
that could repeat a non-idempotent write.
"""

from dataclasses import dataclass, field

from runs.models import AgentRun, WriteReconciliation
from runs.vocabulary import ReconciliationOutcome, RunStatus, StepKind
from tools.effects import ToolEffect
from tools.registry import effect_for

REQUEUEABLE = (RunStatus.FAILED, RunStatus.CANCELLED)


@dataclass(frozen=True)
class ToolPreview:
    name: str
    effect: str


@dataclass(frozen=True)
class RequeueVerdict:
    allowed: bool
    #: Stable, machine-readable: ``safe``, ``status``, ``write_in_doubt``,
    #: ``write_applied``, ``non_idempotent_executed``.
    code: str
    reason: str
    #: The tools the run offers, with their effects: what may execute again.
    tools: list[ToolPreview] = field(default_factory=list)


def requeue_safety(run: AgentRun) -> RequeueVerdict:
    """May ``run`` be requeued by an operator, and if not, why not."""
    tools = [ToolPreview(name, effect_for(name).value) for name in run.request.get("tools", [])]
    if run.status not in REQUEUEABLE:
        return RequeueVerdict(
            False,
            "status",
            f"only failed or cancelled runs can be requeued; this run is {run.status}",
        )
    if run.pending_effect == ToolEffect.NON_IDEMPOTENT_WRITE:
        # The run ended (status checked above) with its fence on a
        # non-idempotent write: it may or may not have landed.
        call = run.pending_call or {}
        tool = call.get("tool", "a non-idempotent write")
        reconciliation = WriteReconciliation.objects.filter(run=run).first()
        if reconciliation is None:
            return RequeueVerdict(
                False,
                "write_in_doubt",
                f"the non_idempotent_write {tool!r} may have landed; reconcile it first",
            )
        if reconciliation.outcome == ReconciliationOutcome.APPLIED:
            return RequeueVerdict(
                False,
                "write_applied",
                f"{reconciliation.operator} reconciled the write {tool!r} as applied; "
                "running the run again would repeat it",
            )
    executed = (
        run.steps.filter(kind=StepKind.TOOL, effect=ToolEffect.NON_IDEMPOTENT_WRITE)
        .exclude(idempotency_key="")
        .order_by("sequence")
        .values("sequence", "tool_name")
        .first()
    )
    if executed is not None:
        # Conservative: a replay would reuse the recorded outcome, but only if
        # the model asks for exactly the same call again, which a real model
        # need not do.
        return RequeueVerdict(
            False,
            "non_idempotent_executed",
            f"step {executed['sequence']} executed the non_idempotent_write "
            f"{executed['tool_name']!r}; running the run again from the start could repeat it",
        )
    return RequeueVerdict(True, "safe", "safe to requeue: it runs again from the start", tools)
