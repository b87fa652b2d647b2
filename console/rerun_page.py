"""The console's "rerun from this step" page (G20): the verdict first —
what the new run replays, the writes the run recorded from that turn on,
and whether it may go ahead — then a form for the new run's input, the
agent version, a note and, past a non-idempotent write, the confirmation
that only ``runs.rerun_past_write`` may give. A thin adapter over
``runs.operators.rerun``, as the API's view is."""

import logging

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from agents.models import AgentVersion
from agents.starting import rerun_request
from console.team_scope import VIEW_RUNS, require, role_needed
from runs.models import AgentRun
from runs.models.vocabulary import SubmittedVia
from runs.operators.rerun import PAST_WRITE_PERMISSION, rerun_from
from runs.operators.rerun_verdict import rerun_verdict
from runs.runtime.enqueue_spend import BudgetRefused
from runs.runtime.run_request import InvalidRunRequest
from teams import access

logger = logging.getLogger(__name__)
#: A rerun is an operator's, as a requeue is (the run page's buttons).
RERUN_PERMISSION = "runs.requeue_agentrun"


class RerunForm(forms.Form):
    input = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4}),
        strip=False,
        help_text="the new run's input (its prompt); as the original's unless changed",
    )
    version = forms.TypedChoiceField(
        coerce=int, required=False, help_text="the agent version the new run runs"
    )
    note = forms.CharField(required=False, help_text="why: recorded on both runs")
    confirm_past_write = forms.BooleanField(
        required=False,
        label="Rerun past the non-idempotent write",
        help_text="the new run asks an operator's approval before any call of it",
    )

    def __init__(self, run: AgentRun, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if run.agent_version_id is None:
            del self.fields["version"]
            return
        numbers = AgentVersion.objects.filter(agent_id=run.agent_version.agent_id).values_list(
            "number", flat=True
        )
        self.fields["version"].choices = [
            (number, f"v{number}{' (the run’s)' if number == run.agent_version.number else ''}")
            for number in sorted(numbers, reverse=True)
        ]


def rerun_page(model_admin, request, run_id, sequence: int):
    if not model_admin.has_requeue_permission(request):
        raise PermissionDenied(f"Rerunning takes {role_needed(RERUN_PERMISSION)}")
    # Another team's run is not found; one seen but not the user's to
    # rerun is a 403 naming the role, in its team (G22).
    visible = access.scoped(AgentRun.objects, request.user, VIEW_RUNS)
    run = get_object_or_404(visible.select_related("agent_version__agent"), pk=run_id)
    require(request.user, RERUN_PERMISSION, run, "Rerunning a run")
    initial = {"input": run.prompt}
    if run.agent_version_id:
        initial["version"] = run.agent_version.number
    form = RerunForm(run, request.POST or None, initial=initial)
    request_data, version, refused = None, ..., ""
    if form.is_valid():
        request_data, version = _request_of(run, form)
    if request.method == "POST" and not form.errors:
        new_run, refused = _rerun(request, run, sequence, form, request_data, version)
        if new_run is not None:
            return redirect(reverse("admin:runs_agentrun_change", args=[new_run.pk]))
    verdict = rerun_verdict(
        run,
        sequence,
        request_data=request_data,
        past_write_confirmed=bool(form.is_bound and form.cleaned_data.get("confirm_past_write")),
    )
    return TemplateResponse(
        request,
        "admin/runs/agentrun/rerun_from.html",
        {
            **model_admin.admin_site.each_context(request),
            "title": f"Rerun from step {sequence}",
            "opts": model_admin.model._meta,
            "run": run,
            "sequence": sequence,
            "verdict": verdict,
            "form": form,
            "refused": refused,
            "may_pass_writes": access.may(request.user, PAST_WRITE_PERMISSION, run.team_id),
        },
    )


def _request_of(run, form):
    """The request and version the form asks for (the run's own input and
    version, as prefilled, change nothing: ``rerun_request``); a field it
    cannot use gets the error beside it."""
    try:
        return rerun_request(
            run,
            new_input=form.cleaned_data["input"],
            version=form.cleaned_data.get("version") or None,
        )
    except InvalidRunRequest as error:
        field, _, message = str(error).partition(":")
        form.add_error(field.strip() if field.strip() in form.fields else None, message.strip())
        return None, ...


def _rerun(request, run, sequence, form, request_data, version) -> tuple[AgentRun | None, str]:
    """Make the rerun: the new run, or None and why not."""
    try:
        result = rerun_from(
            run,
            sequence,
            request.user,
            request_data=request_data,
            agent_version=version,
            note=form.cleaned_data["note"],
            confirm_past_write=form.cleaned_data["confirm_past_write"],
            submitted_via=SubmittedVia.CONSOLE,
        )
    except BudgetRefused as refused:
        return None, str(refused)
    except DatabaseError:
        # The new run, its steps and the original's are one transaction.
        logger.exception("run=%s rerun from step %s failed on a database error", run.pk, sequence)
        return None, "the database could not complete the rerun; nothing was changed"
    if not result.ok:
        return None, result.detail
    messages.success(
        request,
        format_html(
            "Rerun of run {} from step {}: {}.",
            str(run.pk)[:8],
            sequence,
            result.verdict.reason,
        ),
    )
    return result.run, ""
