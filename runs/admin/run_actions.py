"""The operator actions on runs in the admin — requeue, restart, cancel and
reconcile — as the list's actions and the run page's buttons: each a
permission of its own, checked on the server, and each a thin adapter over
``runs.operators`` (the functions the API calls). A requeue or restart of a
run whose failure would likely come again asks first; the message after an
action says what the run did since (``runs.admin.aftermath``)."""

import logging

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme

from runs.admin import aftermath
from runs.admin.reconcile import reconcile_form, reconcile_page
from runs.models import AgentRun
from runs.operators import actions as operator_actions
from runs.operators.lasting_failure import lasting_failure
from runs.operators.requeue_safety import requeue_safety, restart_safety

logger = logging.getLogger(__name__)


class OperatorPermissions:
    """Each operator action is a permission of its own, checked on the server."""

    def changelist_view(self, request, extra_context=None):
        # Django answers an action the user may not run with "no action
        # selected"; a crafted POST for one deserves a plain 403.
        action = request.POST.get("action") if request.method == "POST" else None
        if action and action not in self.get_actions(request):
            raise PermissionDenied
        # A malformed selected id: the site's 400 (nrllm_ops.admin_site).
        extra_context = {
            **(extra_context or {}),
            "can_start_runs": request.user.has_perm("runs.add_agentrun"),
        }
        return super().changelist_view(request, extra_context)

    def has_requeue_permission(self, request, obj=None):
        return request.user.has_perm("runs.requeue_agentrun")

    def has_cancel_permission(self, request, obj=None):
        return request.user.has_perm("runs.cancel_agentrun")

    def has_reconcile_permission(self, request, obj=None):
        return request.user.has_perm("runs.reconcile_agentrun")


class RunActions:
    """Mixed into ``AgentRunAdmin``: its actions and the run page's endpoint."""

    @admin.action(
        description="Requeue selected runs: resume from their journal (safe ones only)",
        permissions=["requeue"],
    )
    def requeue_selected(self, request, queryset):
        return self._back_in_queue(
            request, queryset, "requeue_selected", requeue_safety, operator_actions.requeue
        )

    @admin.action(
        description="Restart selected runs from the beginning (safe ones only)",
        permissions=["requeue"],
    )
    def restart_selected(self, request, queryset):
        return self._back_in_queue(
            request, queryset, "restart_selected", restart_safety, operator_actions.restart
        )

    def _back_in_queue(self, request, queryset, action, verdict_of, perform):
        """The confirmation page with each run's verdict (and why running it
        again may fail the same way), then, confirmed, the action on every
        run its verdict allows; a message per run says what it did since."""
        runs = list(queryset)
        restart = action == "restart_selected"
        if request.POST.get("confirm") != "yes":
            return self.requeue_confirmation(request, runs, verdict_of, restart=restart)
        note = request.POST.get("note", "")
        word = "restart" if restart else "requeue"
        for run in runs:
            result = perform(run, request.user, note)
            self._say(request, run.pk, word, result, with_run=True)
        return None

    def requeue_confirmation(self, request, runs, verdict_of, *, restart, action_url=""):
        """The page that asks before a requeue or restart: each run's verdict,
        the unsafe ones left out, and a warning where the failure would come
        again (``lasting_failure``). Confirmed, it posts back with
        ``confirm=yes`` to ``action_url`` (this URL when empty)."""
        rows = []
        for run in runs:
            verdict = verdict_of(run)
            warning = lasting_failure(run) if verdict.allowed else ""
            rows.append({"run": run, "verdict": verdict, "warning": warning})
        return TemplateResponse(
            request,
            "admin/runs/agentrun/requeue_confirmation.html",
            {
                **self.admin_site.each_context(request),
                "title": "Restart runs from the beginning" if restart else "Requeue runs",
                "opts": self.model._meta,
                "action": "restart_selected" if restart else "requeue_selected",
                "action_url": action_url,
                "restart": restart,
                "rows": rows,
                "warned": any(row["warning"] for row in rows),
                "note": request.POST.get("note", ""),
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            },
        )

    @admin.action(description="Cancel selected runs", permissions=["cancel"])
    def cancel_selected(self, request, queryset):
        for run in queryset:
            result = operator_actions.cancel(run, request.user)
            self._say(request, run.pk, "cancel", result, with_run=True)

    def _say(self, request, run_id, action, result, *, with_run=False):
        """The message after ``action``: done, and what the run did since
        (``aftermath``); or refused, and why."""
        if result.ok:
            message = aftermath.after_action(run_id, action, result.detail, with_run=with_run)
            self.message_user(request, message, messages.SUCCESS)
            return
        if with_run:
            message = format_html(
                "{}not {}: {}.", aftermath.run_named(run_id), _DONE[action], result.detail
            )
            self.message_user(request, message, messages.WARNING)
        else:
            self.message_user(request, f"Not {_DONE[action]}: {result.detail}.", messages.ERROR)

    def operator_action_view(self, request, run_id, action):
        """POST-only endpoint of the detail page's buttons and forms. A
        requeue or restart of a run whose failure would likely come again
        asks first (``lasting_failure``); the message after an action says
        what the run did since (``aftermath``)."""
        if action not in RUN_ACTIONS:
            raise Http404(f"no action {action!r}")
        if request.method != "POST":
            return redirect(reverse("admin:runs_agentrun_change", args=[run_id]))
        permission, perform = RUN_ACTIONS[action]
        if not getattr(self, permission)(request):
            raise PermissionDenied
        run = get_object_or_404(AgentRun, pk=run_id)
        form = request.POST
        if action == "reconcile":
            # Sent without a choice or a note: asked again, nothing recorded.
            reconciling = reconcile_form(run, request.POST)
            if not reconciling.is_valid():
                return reconcile_page(self, request, run, reconciling)
            form = reconciling.cleaned_data
        if action in ("requeue", "restart") and request.POST.get("confirm") != "yes":
            # Asked only where it would go ahead: a refusal says why itself.
            verdict_of = restart_safety if action == "restart" else requeue_safety
            if lasting_failure(run) and verdict_of(run).allowed:
                return self.requeue_confirmation(
                    request, [run], verdict_of, restart=action == "restart", action_url=request.path
                )
        try:
            result = perform(run, request.user, form)
        except DatabaseError:
            # The action and its step are one transaction: nothing happened.
            logger.exception("run=%s %s failed on a database error", run_id, action)
            self.message_user(
                request,
                "The database could not complete the action; nothing was changed.",
                messages.ERROR,
            )
        else:
            if action == "reconcile" and result.ok:
                self.message_user(request, reconciled_message(run_id, result), messages.SUCCESS)
            else:
                self._say(request, run_id, action, result)
        back = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
            back = reverse("admin:runs_agentrun_change", args=[run_id])
        return redirect(back)


def reconciled_message(run_id, result) -> str:
    """A reconciliation moves nothing: it says what was recorded, and what a
    requeue would now do (or why it still may not)."""
    run = AgentRun.objects.get(pk=run_id)
    verdict = requeue_safety(run)
    requeue = "a requeue: " if verdict.allowed else "a requeue is still refused: "
    return f"Reconciled: {result.detail}. The run stays {run.status}; {requeue}{verdict.reason}."


#: The past participle each action's messages use.
_DONE = {
    "requeue": "requeued",
    "restart": "restarted",
    "cancel": "cancelled",
    "reconcile": "reconciled",
}

#: action name → (permission check, what it does with the POSTed form)
RUN_ACTIONS = {
    "requeue": (
        "has_requeue_permission",
        lambda run, user, form: operator_actions.requeue(run, user, form.get("note", "")),
    ),
    "restart": (
        "has_requeue_permission",
        lambda run, user, form: operator_actions.restart(run, user, form.get("note", "")),
    ),
    "cancel": (
        "has_cancel_permission",
        lambda run, user, form: operator_actions.cancel(run, user, form.get("note", "")),
    ),
    "reconcile": (
        "has_reconcile_permission",
        lambda run, user, form: operator_actions.reconcile(
            run, user, form.get("outcome", ""), form.get("note", "")
        ),
    ),
}
