"""A run's page in the console (the admin's change view of a run), laid out
for a laptop (issue #30): a summary first — status, error, tokens, how long
it ran, its attempts, what it did since an operator's last action, and what
an operator can do now (approve, deny or edit a waiting call, answer the
agent's question, requeue with the verdict beside the button) — then its
fields in a compact grid, its approvals and questions, attempts and steps.

A run that failed on a provider error records no step for the model call
that failed (nothing came back to record): the page shows that call, from
the run's error fields, at the end of the step timeline.
"""

from datetime import timedelta

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models.fields.json import KeyTransform
from django.urls import reverse
from django.utils.html import format_html

from console import aftermath, approval_rows
from console import figures as console
from console.display import (
    as_text,
    moment,
    position_in_words,
    span,
)
from console.reconcile import reconcile_form
from console.run_columns import error_text, ran_for, why_so
from console.run_trace import failed_model_call, trace_rows
from console.team_scope import VIEW_RUNS
from console.trigger_forms import both_clocks
from console.write_in_doubt import described_write
from runs.models import AgentRun
from runs.models.vocabulary import RunStatus, StepKind, SubmittedVia
from runs.operators.lasting_failure import lasting_failure
from runs.operators.requeue_safety import requeue_safety, restart_safety
from runs.run_webhooks import deliveries_of
from runs.runtime.rate_limit import waiting_for
from teams import access
from triggers.models import Firing, TriggerEvent

STEPS_PER_PAGE = 50
#: Fields of free text: a row of the grid each.
WIDE_FIELDS = ("prompt", "request_shown", "output")


class RunPageFields:
    """The page's fields that a column's name would label badly ("Llm
    latency ms", "Id"), and its moments, to the second and with their zone
    (the admin's own format has neither)."""

    @admin.display(description="run id")
    def run_id_full(self, run: AgentRun) -> str:
        return str(run.pk)

    @admin.display(description="the request (JSON)")
    def request_shown(self, run: AgentRun):
        """The request as stored, once on the page (the request steps link
        here), folded: the prompt above is its start."""
        text = as_text(run.request)
        return format_html(
            '<details id="request-json"><summary>as stored, {} lines of JSON</summary>'
            '<pre class="full-value">{}</pre></details>',
            text.count("\n") + 1,
            text,
        )

    @admin.display(description="time in model calls")
    def model_time_shown(self, run: AgentRun) -> str:
        """The latencies its model turns' steps recorded, added up over all
        attempts ("1.4 s in 3 model calls"); "-" when none recorded one.

        Read from the steps, not the run's ``llm_latency_ms``: that total
        grows only with turns that report usage, and a scripted turn reports
        none (the page said "-" for every run of the demo). A rerun's copies
        of its original's turns are not its calls: their time is not its."""
        latencies = [
            latency
            for latency in run.steps.filter(kind=StepKind.LLM, replay_of__isnull=True).values_list(
                KeyTransform("latency_ms", "result"), flat=True
            )
            # A number the worker or the provider timed; anything else is no time.
            if isinstance(latency, int | float) and not isinstance(latency, bool) and latency >= 0
        ]
        if not latencies:
            return "-"
        total = sum(latencies)
        took = f"{round(total)} ms" if total < 1000 else span(timedelta(milliseconds=total))
        calls = len(latencies)
        return f"{took} in {calls} model call{'' if calls == 1 else 's'}"

    @admin.display(description="write executing (fence)")
    def fence_shown(self, run: AgentRun) -> str:
        return run.pending_effect or "none"

    @admin.display(description="attempt (lease token)")
    def attempt_shown(self, run: AgentRun) -> int:
        return run.lease_token

    @admin.display(description="requeues")
    def requeues_shown(self, run: AgentRun) -> int:
        return run.requeue_count

    @admin.display(description="journal begins after step")
    def journal_shown(self, run: AgentRun) -> int:
        return run.journal_begins_after

    @admin.display(description="created")
    def created_shown(self, run: AgentRun) -> str:
        return moment(run.created_at) or "-"

    @admin.display(description="started (last claim)")
    def started_shown(self, run: AgentRun) -> str:
        return moment(run.started_at) or "-"

    @admin.display(description="finished")
    def finished_shown(self, run: AgentRun) -> str:
        return moment(run.finished_at) or "-"

    @admin.display(description="lease expires")
    def lease_expires_shown(self, run: AgentRun) -> str:
        return moment(run.lease_expires_at) or "-"

    @admin.display(description="agent")
    def agent_shown(self, run: AgentRun) -> str:
        """The agent version it started from (G18), linked to that version
        as it was saved; "-" for a run whose request was given whole."""
        if run.agent_version_id is None:
            return "-"
        version = run.agent_version
        url = reverse("admin:agents_agentversion_change", args=[version.pk])
        return format_html('<a href="{}">{} v{}</a>', url, version.agent.name, version.number)


def started_by(user, run: AgentRun) -> dict | None:
    """What started ``run`` without a person's click (G23): the schedule
    and the slot it fired for, on the schedule's clock, or the trigger and
    the sender's event id; None for any other run (without a query). The
    schedule or trigger is linked for whoever may see it."""
    if run.submitted_via == SubmittedVia.SCHEDULE:
        firing = Firing.objects.filter(run_id=run.pk).select_related("schedule__agent").first()
        if firing is None:
            return None
        schedule = firing.schedule
        return {
            "schedule": schedule,
            "slot": both_clocks(firing.slot, schedule.time_zone),
            "backfill": firing.backfill,
            "linked": access.may(user, "triggers.view_schedule", access.team_id_of(schedule)),
        }
    if run.submitted_via == SubmittedVia.TRIGGER:
        event = TriggerEvent.objects.filter(run_id=run.pk).select_related("trigger__agent").first()
        if event is None:
            return None
        return {
            "trigger": event.trigger,
            "event_id": event.event_id,
            "linked": access.may(
                user, "triggers.view_eventtrigger", access.team_id_of(event.trigger)
            ),
        }
    return None


def run_page_context(model_admin, request, run: AgentRun) -> dict:
    """What ``templates/admin/runs/agentrun/change_form.html`` shows of ``run``
    to ``request.user``, with the buttons their permissions allow."""
    steps = Paginator(run.steps.order_by("sequence"), STEPS_PER_PAGE).get_page(
        request.GET.get("steps_page")
    )
    failed_call = failed_model_call(run)
    attempts = console.attempts(run)
    pending_calls = []
    if run.status in RunStatus.waiting():
        groups, _ = approval_rows.pending_groups(request.user, run.pk)
        pending_calls = [call for group in groups for call in group["calls"]]
    visible = access.scoped(AgentRun.objects, request.user, VIEW_RUNS)
    since = aftermath.since_last_action(run, with_error=False)  # the summary shows it
    approvals = approval_rows.history(run)
    for approval in approvals:
        approval.position_words = position_in_words(approval.position)
    return {
        "run": run,
        "summary": {
            "why": why_so(run),
            "error": error_text(run),
            "ran": ran_for(run),
            "spend": model_admin.spend(run),
            "attempts": len(attempts),
            "created": moment(run.created_at),
            "failed_call": failed_call,
            # A Redis key the waiting attempt holds (runs.runtime.rate_limit).
            "rate_limit": waiting_for(run.pk) if run.status == RunStatus.RUNNING else None,
        },
        "since": since,
        "started_by": started_by(request.user, run),
        "since_heading": since.heading(request.user) if since else "",
        "pending_calls": pending_calls,
        "wide_fields": WIDE_FIELDS,
        "steps_page": steps,
        "timeline": trace_rows(run, steps),
        # After the last step, where it happened.
        "failed_call_row": failed_call if not steps.has_next() else None,
        "verdict": requeue_safety(run),
        "restart_verdict": restart_safety(run),
        "lasting_failure": lasting_failure(run),
        "attempts": attempts,
        "reconciliation": run.reconciliation,
        # The write on its fence, in words: what to check, where (G10).
        "write": described_write(run),
        "dead_letters": run.dead_letters.select_related("resolved_by").order_by("-created_at"),
        "approvals": approvals,
        "webhook_deliveries": deliveries_of(run.pk),  # G19
        "can_requeue": model_admin.has_requeue_permission(request, run),
        # G20: from any model turn of an ended run's journal.
        "can_rerun": model_admin.has_requeue_permission(request, run) and run.is_terminal,
        # A rerun keeps its original's team; scoped all the same (G22).
        "reruns": visible.filter(rerun_of=run.pk)
        .order_by("created_at")
        .only("pk", "status", "rerun_from_sequence"),
        "rerun_original_exists": bool(run.rerun_of) and visible.filter(pk=run.rerun_of).exists(),
        "can_cancel": model_admin.has_cancel_permission(request, run) and not run.is_terminal,
        # "Run again": in the run's team (an agent's start runs there).
        "can_start_runs": access.may(request.user, "runs.add_agentrun", run.team_id),
        "can_reconcile": model_admin.has_reconcile_permission(request, run),
        "reconcile_form": reconcile_form(run),
    }
