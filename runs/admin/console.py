"""What the operator pages show: the overview numbers and the writes in doubt."""

from datetime import timedelta

from django.db.models import Count, Max, Min, Q
from django.utils import timezone

from runs.admin.display import shortened
from runs.admin.run_spend import spend_by_attempt
from runs.models import AgentRun, ApprovalRequest, DeadLetter, ProviderCircuit
from runs.operators.actions import write_in_question
from runs.selectors import EXECUTED_WRITE, write_audit_runs, writes_in_doubt
from runs.vocabulary import ApprovalStatus, RunStatus, StepKind


def overview() -> dict:
    """Runs by status and termination reason over the last 24 hours, open
    dead letters, writes in doubt, calls waiting for approval; each number
    links to the filtered list (or the approvals inbox)."""
    since = timezone.now() - timedelta(hours=24)
    recent = AgentRun.objects.filter(created_at__gte=since)
    by_outcome = (
        recent.values("status", "termination_reason")
        .annotate(runs=Count("id"))
        .order_by("status", "termination_reason")
    )
    return {
        "since": since,
        "by_outcome": list(by_outcome),
        "open_dead_letters": DeadLetter.objects.filter(resolved_at__isnull=True).count(),
        "writes_in_doubt": writes_in_doubt(AgentRun.objects.all()).count(),
        "running": AgentRun.objects.filter(status="running").count(),
        "queued": AgentRun.objects.filter(status="queued").count(),
        "waiting_for_approval": AgentRun.objects.filter(
            status=RunStatus.WAITING_FOR_APPROVAL
        ).count(),
        # The partial index approval_pending_idx holds exactly these rows.
        "pending_approvals": ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING).count(),
        "since_param": since.isoformat(timespec="seconds"),
        "circuits": ProviderCircuit.objects.prefetch_related("transitions"),
    }


def write_audits(limit: int = 200) -> list[dict]:
    """The rows of the failed-write-audits page (see ``write_audit_runs``)."""
    runs = write_audit_runs(limit)
    rows = []
    for run in runs:
        call = write_in_question(run)
        rows.append(
            {
                "run": run,
                "call": call,
                "arguments": shortened(call.get("arguments")),
                "reconciliation": run.reconciliation,
                "reconcilable": run.is_terminal
                and bool(run.pending_effect)
                and run.reconciliation is None,
            }
        )
    return rows


def attempts(run: AgentRun) -> list[dict]:
    """Per attempt (lease token), oldest first: when it started, what it
    replayed from the journal (its resume step), what it did live and what
    its model turns spent. Three queries, however many steps the run has."""
    rows = (
        run.steps.filter(kind__in=[StepKind.REQUEST, StepKind.RESUME, StepKind.LLM, StepKind.TOOL])
        .values("lease_token")
        .annotate(
            first=Min("sequence"),
            last=Max("sequence"),
            started=Min("created_at"),
            model_turns=Count("pk", filter=Q(kind=StepKind.LLM)),
            tool_calls=Count("pk", filter=Q(kind=StepKind.TOOL)),
            writes=Count("pk", filter=EXECUTED_WRITE),
        )
        .order_by("lease_token")
    )
    resumed = dict(run.steps.filter(kind=StepKind.RESUME).values_list("lease_token", "result"))
    spent = spend_by_attempt(run)
    return [
        {**row, "resumed": resumed.get(row["lease_token"]), "spend": spent.get(row["lease_token"])}
        for row in rows
    ]
