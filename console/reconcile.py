"""The form that records whether a write in doubt landed, on the run's page
and the failed write audits page, and the page that asks again when it was
sent incomplete.

No outcome is chosen for the operator: ``applied`` and ``not_applied`` lead
to opposite actions (a requeue that would repeat a write, or one that sends
it again), so neither is a default. The browser will not send the form
without a choice (each radio is ``required``); a request that does anyway
(or without a note) gets this form again, each error beside its field, and
nothing is recorded. The outcome and note are then checked again, with the
run's state, by ``runs.operators.actions.reconcile`` (the API's too)."""

from django import forms
from django.template.response import TemplateResponse

from console.display import shortened
from console.write_in_doubt import described_write
from runs.models import AgentRun
from runs.models.vocabulary import ReconciliationOutcome
from runs.operators.actions import write_in_question

#: What each outcome means, as the operator chooses it.
OUTCOME_CHOICES = [
    (ReconciliationOutcome.APPLIED.value, "applied: it landed"),
    (ReconciliationOutcome.NOT_APPLIED.value, "not_applied: it did not"),
]


class ReconcileForm(forms.Form):
    outcome = forms.ChoiceField(
        choices=OUTCOME_CHOICES,
        widget=forms.RadioSelect,
        error_messages={"required": "Choose whether the write landed: applied or not_applied."},
    )
    note = forms.CharField(
        max_length=10_000,
        widget=forms.TextInput(attrs={"placeholder": "note (mandatory)", "size": 30}),
        error_messages={"required": "Say why: a note is required."},
    )


def reconcile_form(run: AgentRun, data=None) -> ReconcileForm:
    """The form for ``run``'s write; its element ids are the run's own, so
    a page may hold one per run."""
    return ReconcileForm(data, auto_id=f"reconcile-{run.pk}-%s")


def reconcile_page(model_admin, request, run: AgentRun, form: ReconcileForm):
    """The form sent incomplete, again, with the write it is about — what
    to check and where, as the run's page says it: 400."""
    call = write_in_question(run)
    return TemplateResponse(
        request,
        "admin/runs/reconcile.html",
        {
            **model_admin.admin_site.each_context(request),
            "title": "Reconcile the write in doubt",
            "opts": model_admin.model._meta,
            "run": run,
            "write": described_write(run),
            "reconciliation": run.reconciliation,
            "can_reconcile": True,  # its sender may: the view checked
            "arguments": shortened(call.get("arguments")),
            "form": form,
            "next": request.POST.get("next", ""),
        },
        status=400,
    )
