"""What the operator pages show: the overview's numbers, the writes in
doubt, a run's attempts."""

from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.db.models import Count, Max, Min, Q
from django.urls import reverse

from console.display import cut, moment, short_id, shortened, span
from console.reconcile import reconcile_form
from console.run_spend import spend_by_attempt
from console.write_in_doubt import described_write
from runs.models import AgentRun, DeadLetter, HeldRun, ProviderCircuit
from runs.models.selectors import (
    EXECUTED_WRITE,
    note_writes_in_doubt,
    write_audit_runs,
    writes_in_doubt,
)
from runs.models.vocabulary import RunStatus, StepKind, TerminationReason
from runs.operators.actions import write_in_question
from teams import access

VIEW_RUNS = "runs.view_agentrun"
RECONCILE = "runs.reconcile_agentrun"
#: A prompt on the write audits page: what the run was asked, in a line or two.
PROMPT_CHARS = 120
#: The statuses of runs not yet ended.
LIVE = (
    RunStatus.QUEUED,
    RunStatus.RUNNING,
    RunStatus.WAITING_FOR_APPROVAL,
    RunStatus.WAITING_FOR_INPUT,
)


def overview(now: datetime, user) -> dict:
    """The numbers of the overview's *Now* module, each with the link to
    exactly its rows: the runs waiting for approval (the calls waiting
    are the header's count, ``pending_approvals``) and for input (a
    question or a deferred call: the header's ``pending_questions`` and
    ``pending_deferred``), writes in doubt, dead
    letters (open; made in the last 24 hours), running runs (and those
    whose lease expired: the reaper's next pass recovers them), queued
    runs (and the overdue ones: due more than
    ``NRLLM_REDISPATCH_AFTER_SECONDS`` ago and still not claimed, so no
    worker is taking them). ``now`` is the database's. Every figure counts
    only the runs of the teams where ``user`` may view runs (G22), and how
    many queued ones their team's cap holds. Six queries, each on an index
    but the dead letters' (a table of one row per dead run): the writes in
    doubt are two (``runs.models.selectors``)."""
    runs = access.scoped(AgentRun.objects, user, VIEW_RUNS)
    # The dead letters of the runs the user sees: the overview links them
    # only for one who may view dead letters, and counts them for anyone.
    letters = access.scoped(DeadLetter.objects, user, VIEW_RUNS)
    day_ago = now - timedelta(hours=24)
    overdue_before = now - timedelta(seconds=settings.NRLLM_REDISPATCH_AFTER_SECONDS)
    live = runs.filter(status__in=LIVE).aggregate(
        running=Count("pk", filter=Q(status=RunStatus.RUNNING)),
        lease_expired=Count("pk", filter=Q(status=RunStatus.RUNNING, lease_expires_at__lt=now)),
        queued=Count("pk", filter=Q(status=RunStatus.QUEUED)),
        overdue=Count("pk", filter=Q(status=RunStatus.QUEUED, available_at__lt=overdue_before)),
        waiting_for_approval=Count("pk", filter=Q(status=RunStatus.WAITING_FOR_APPROVAL)),
        waiting_for_input=Count("pk", filter=Q(status=RunStatus.WAITING_FOR_INPUT)),
    )
    # Queued, and waiting for a slot under their team's cap (G22): no worker
    # is meant to take them before one of the team's runs ends.
    held = (
        access.scoped(HeldRun.objects, user, VIEW_RUNS)
        .filter(run__status=RunStatus.QUEUED)  # a cancelled one's hold goes next pass
        .count()
    )
    dead_letters = letters.aggregate(
        open=Count("pk", filter=Q(resolved_at__isnull=True)),
        last_day=Count("pk", filter=Q(created_at__gte=day_ago)),
    )
    runs_url = reverse("admin:runs_agentrun_changelist")
    dead_letters_url = reverse("admin:runs_deadletter_changelist")
    return {
        **live,
        "held": held,
        "open_dead_letters": dead_letters["open"],
        "dead_letters_last_day": dead_letters["last_day"],
        "writes_in_doubt": writes_in_doubt(runs).count(),
        "overdue_after": settings.NRLLM_REDISPATCH_AFTER_SECONDS,
        "links": {
            "waiting_for_approval": filtered_url(
                runs_url, status__exact=RunStatus.WAITING_FOR_APPROVAL
            ),
            "waiting_for_input": filtered_url(runs_url, status__exact=RunStatus.WAITING_FOR_INPUT),
            "writes_in_doubt": filtered_url(runs_url, write_in_doubt="yes"),
            "open_dead_letters": filtered_url(dead_letters_url, state="open"),
            "dead_letters_last_day": filtered_url(dead_letters_url, created_at__gte=day_ago),
            "running": filtered_url(runs_url, status__exact=RunStatus.RUNNING),
            "lease_expired": filtered_url(runs_url, lease="expired"),
            "queued": filtered_url(runs_url, status__exact=RunStatus.QUEUED),
            "overdue": filtered_url(
                runs_url, status__exact=RunStatus.QUEUED, available_at__lt=overdue_before
            ),
        },
        "circuits": ProviderCircuit.objects.prefetch_related("transitions"),
    }


def filtered_url(url: str, **filters) -> str:
    """``url`` with ``filters`` as its query (datetimes in ISO 8601)."""
    query = {
        key: value.isoformat() if isinstance(value, datetime) else str(value)
        for key, value in filters.items()
    }
    return f"{url}?{urlencode(query)}"


def write_audits(now: datetime, user, limit: int = 200) -> list[dict]:
    """The rows of the failed-write-audits page (see ``write_audit_runs``):
    each run with its prompt, age and newest dead letter, the write in
    question in words (``write_in_doubt``) and, while it is in doubt, where
    to check it and the form to reconcile it — only the runs of the teams
    where ``user`` may view runs, and the form where it may reconcile.
    Five queries, however many rows (the writes in doubt among them are
    two, the idempotent ones' journals one)."""
    # Unsliced (``[:None]``), scoped, then cut to ``limit``: cut first, a
    # member would get what is left of the deployment's newest ``limit``.
    every = write_audit_runs(None)
    runs = list(access.scoped(every, user, VIEW_RUNS).prefetch_related("dead_letters")[:limit])
    note_writes_in_doubt(runs)
    rows = []
    for run in runs:
        call = write_in_question(run)
        write = described_write(run, with_late_result=False)
        dead_letters = sorted(run.dead_letters.all(), key=lambda letter: letter.created_at)
        rows.append(
            {
                "run": run,
                "short_id": short_id(run.pk),
                "prompt": cut(run.prompt, PROMPT_CHARS),
                "age": span(now - run.created_at, units=1),
                "created": moment(run.created_at),
                "dead_letter": dead_letters[-1] if dead_letters else None,
                "write": write,
                "why": write.why_short if write else _REASON_WORDS.get(run.termination_reason, ""),
                "arguments": shortened(call.get("arguments")),
                "reconciliation": run.reconciliation,
                "reconcile_form": reconcile_form(run),
                "can_reconcile": access.may(user, RECONCILE, run.team_id),
            }
        )
    return rows


#: Why a run without a write in question is on the write audits page.
_REASON_WORDS = {
    TerminationReason.JOURNAL_UNREPLAYABLE: "its journal could not be replayed",
    TerminationReason.WRITE_INTERRUPTED: "a write was interrupted",
    TerminationReason.NOT_RETRYABLE: "a write's record could not be saved",
}


def attempts(run: AgentRun) -> list[dict]:
    """Per attempt (lease token), oldest first: when it started, what it
    replayed from the journal (its resume step), what it did live and what
    its model turns spent. Three queries, however many steps the run has."""
    rows = (
        run.steps.filter(kind__in=[StepKind.REQUEST, StepKind.RESUME, StepKind.LLM, StepKind.TOOL])
        # Token 0: the steps a rerun copied from its original (G20), which
        # no attempt of this run made; its first attempt's resume says so.
        .exclude(lease_token=0)
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
