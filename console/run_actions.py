"""The operator actions on one run in the admin — requeue, restart, cancel
and reconcile — as the run page's buttons (the list's actions on many runs
are ``console.bulk_actions``): each a
permission of its own, checked on the server, and each a thin adapter over
``runs.operators`` (the functions the API calls). A requeue or restart of a
run whose failure would likely come again asks first; the message after an
action says what the run did since (``console.aftermath``)."""

import logging

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme

from console import aftermath
from console.reconcile import reconcile_form, reconcile_page
from console.team_scope import VIEW_RUNS, refusal, role_needed
from runs.models import AgentRun
from runs.operators import actions as operator_actions
from runs.operators.bulk import BULK_ACTIONS
from runs.operators.lasting_failure import lasting_failure
from runs.operators.requeue_safety import requeue_safety
from teams import access

logger = logging.getLogger(__name__)


class OperatorPermissions:
    """Each operator action is a permission of its own, checked on the
    server, in the team of the object it acts on (G22): asked without an
    object, whether the user may act so in some team (the page shows the
    action); asked of a run or a dead letter, whether in its team."""

    #: An action's ``permissions`` name → the Django permission it takes.
    operator_permissions = {
        "requeue": "runs.requeue_agentrun",
        "cancel": "runs.cancel_agentrun",
        "reconcile": "runs.reconcile_agentrun",
        "dismiss": "runs.dismiss_deadletter",
    }

    def changelist_view(self, request, extra_context=None):
        # Django answers an action the user may not run with "no action
        # selected"; a crafted POST for one deserves a plain 403.
        action = request.POST.get("action") if request.method == "POST" else None
        if action and action not in self.get_actions(request):
            raise PermissionDenied(self._refused_action(action))
        # A malformed selected id: the site's 400 (console.site).
        extra_context = {
            **(extra_context or {}),
            "can_start_runs": request.user.has_perm("runs.add_agentrun"),
        }
        return super().changelist_view(request, extra_context)

    def _refused_action(self, action: str) -> str:
        """Why a list's action is not this user's: the role it takes."""
        function = getattr(self, action, None)
        for name in getattr(function, "allowed_permissions", ()):
            if name in self.operator_permissions:
                return f"{action} takes {role_needed(self.operator_permissions[name])}"
        return ""

    def _may_act(self, request, name: str, obj) -> bool:
        permission = self.operator_permissions[name]
        if obj is None:
            return access.may_somewhere(request.user, permission)
        return access.may(request.user, permission, access.team_id_of(obj))

    def has_requeue_permission(self, request, obj=None):
        return self._may_act(request, "requeue", obj)

    def has_cancel_permission(self, request, obj=None):
        return self._may_act(request, "cancel", obj)

    def has_reconcile_permission(self, request, obj=None):
        return self._may_act(request, "reconcile", obj)


class RunActions:
    """Mixed into ``AgentRunAdmin``: the run page's endpoint (the list's
    actions are ``console.bulk_actions``)."""

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
        # Another team's run is not found; one the user sees but may not
        # act on in its team is a 403 naming the role it takes.
        run = get_object_or_404(access.scoped(AgentRun.objects, request.user, VIEW_RUNS), pk=run_id)
        if not getattr(self, permission)(request, run):
            name = permission.removeprefix("has_").removesuffix("_permission")
            raise PermissionDenied(
                refusal(self.operator_permissions[name], run.team_id, f"{_DOING[action]} a run")
            )
        form = request.POST
        if action == "reconcile":
            # Sent without a choice or a note: asked again, nothing recorded.
            reconciling = reconcile_form(run, request.POST)
            if not reconciling.is_valid():
                return reconcile_page(self, request, run, reconciling)
            form = reconciling.cleaned_data
        if action in ("requeue", "restart") and request.POST.get("confirm") != "yes":
            # Asked only where it would go ahead: a refusal says why itself.
            bulk_action = BULK_ACTIONS[action]
            if lasting_failure(run) and bulk_action.verdict(run).allowed:
                return self.bulk_preview(
                    request,
                    bulk_action,
                    [run],
                    action_url=request.path,
                    back_url=reverse("admin:runs_agentrun_change", args=[run_id]),
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

#: What each action is, as a refusal says it.
_DOING = {
    "requeue": "Requeueing",
    "restart": "Restarting",
    "cancel": "Cancelling",
    "reconcile": "Reconciling",
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
