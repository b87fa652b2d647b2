"""Runs in the admin: a read-only list and detail, the requeue, restart and
cancel actions, and the operator pages (overview, writes in doubt, reconcile;
the approvals inbox is runs/admin/approvals.py)."""

import logging

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import DatabaseError
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html_join
from django.utils.http import url_has_allowed_host_and_scheme

from nrllm_ops.admin_site import ReadOnly
from runs.admin import approval_rows, console, search
from runs.admin.approvals import ApprovalsInbox
from runs.admin.display import effect_badge, shortened
from runs.admin.filters import (
    LeaseFilter,
    OffersToolFilter,
    RequeueCountFilter,
    WriteInDoubtFilter,
)
from runs.admin.paginator import BoundedCountPaginator
from runs.admin.run_spend import RunSpendFields, turn_spend_text
from runs.admin.spend_overview import spend_overview
from runs.admin.start_run import start_run_page
from runs.models import AgentRun
from runs.operators import actions as operator_actions
from runs.operators.requeue_safety import requeue_safety, restart_safety
from tools.registry import effect_for

logger = logging.getLogger(__name__)

STEPS_PER_PAGE = 50


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


@admin.register(AgentRun)
class AgentRunAdmin(
    ReadOnly, OperatorPermissions, ApprovalsInbox, RunSpendFields, admin.ModelAdmin
):
    list_display = [
        "id",
        "status",
        "termination_reason",
        "failure_class",
        "spend",
        "mode",
        "write_tools",
        "fence",
        "requeue_count",
        "lease_owner",
        "lease_expires_at",
        "created_at",
        "finished_at",
    ]
    list_filter = [
        "status",
        "termination_reason",
        "failure_class",
        "mode",
        "pending_effect",
        WriteInDoubtFilter,
        OffersToolFilter,
        RequeueCountFilter,
        LeaseFilter,
        "created_at",
        "finished_at",
    ]
    # What the search box searches; get_search_results (runs/admin/search.py)
    # does the searching.
    search_fields = ["=id", "prompt", "=lease_owner"]
    ordering = ["-created_at"]
    paginator = BoundedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    actions = ["requeue_selected", "restart_selected", "cancel_selected"]
    fieldsets = [
        ("Request", {"fields": ["id", "mode", "prompt", "submitted_by", "submitted_via"]}),
        (
            "Outcome",
            {
                "fields": [
                    "status",
                    "termination_reason",
                    "failure_class",
                    "error_type",
                    "error_message",
                    "output",
                    "llm_latency_ms",
                ]
            },
        ),
        (
            "Spend",
            {
                "fields": [
                    "prompt_tokens",
                    "cached_prompt_tokens",
                    "completion_tokens",
                    "total_tokens_shown",
                    "cost_shown",
                    "tokens_saved_by_replay",
                ],
                "description": "Over all attempts; each turn priced when it was recorded, "
                "at the price its attempt read as it began.",
            },
        ),
        (
            "Lease",
            {
                "classes": ["collapse"],
                "fields": [
                    "lease_owner",
                    "lease_expires_at",
                    "lease_token",
                    "pending_effect",
                    "requeue_count",
                    "journal_begins_after",
                    "created_at",
                    "started_at",
                    "finished_at",
                ],
            },
        ),
    ]

    # Everything shown is read-only: history is never edited here.
    readonly_fields = [name for _, options in fieldsets for name in options["fields"]]

    def get_search_results(self, request, queryset, search_term):
        return search.search_runs(queryset, search_term), False

    def get_ordering(self, request):
        if search.is_text_search(request.GET.get("q", "")):
            return search.ordering()
        return super().get_ordering(request)

    # --- columns ---------------------------------------------------------------

    @admin.display(description="write tools")
    def write_tools(self, run):
        # From the stored request and the code's effects: no query per row.
        writes = [name for name in run.request.get("tools", []) if effect_for(name).is_write]
        return format_html_join(" ", "{}", ((name,) for name in writes))

    @admin.display(description="fence", ordering="pending_effect")
    def fence(self, run):
        return effect_badge(run.pending_effect)

    # --- the detail page --------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # get_object() takes a malformed id (not a UUID) for a missing one.
        run = self.get_object(request, unquote(object_id))
        if run is None:
            return super().change_view(request, object_id, form_url)  # "does not exist"
        steps = Paginator(run.steps.order_by("sequence"), STEPS_PER_PAGE).get_page(
            request.GET.get("steps_page")
        )
        context = {
            "run": run,
            "request_json": shortened(run.request),
            "steps_page": steps,
            "timeline": [
                {
                    "step": step,
                    "badge": effect_badge(step.effect),
                    "arguments": shortened(step.arguments),
                    "outcome": shortened(step.error or step.result),
                    "approval": approval_rows.approval_summary(step),
                    "spend": turn_spend_text(step),
                }
                for step in steps
            ],
            "verdict": requeue_safety(run),
            "restart_verdict": restart_safety(run),
            "attempts": console.attempts(run),
            "reconciliation": run.reconciliation,
            "write_in_question": operator_actions.write_in_question(run),
            "dead_letters": run.dead_letters.all(),
            "approvals": approval_rows.history(run),
            "can_requeue": self.has_requeue_permission(request),
            "can_cancel": self.has_cancel_permission(request) and not run.is_terminal,
            "can_reconcile": self.has_reconcile_permission(request),
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, extra_context=context)

    # --- actions ------------------------------------------------------------------

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
        """The confirmation page with each run's verdict, then, confirmed,
        the action on every run its verdict allows."""
        runs = list(queryset)
        if request.POST.get("confirm") != "yes":
            restart = action == "restart_selected"
            return TemplateResponse(
                request,
                "admin/runs/agentrun/requeue_confirmation.html",
                {
                    **self.admin_site.each_context(request),
                    "title": "Restart runs from the beginning" if restart else "Requeue runs",
                    "opts": self.model._meta,
                    "action": action,
                    "restart": restart,
                    "verdicts": [(run, verdict_of(run)) for run in runs],
                    "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
                },
            )
        note = request.POST.get("note", "")
        for run in runs:
            result = perform(run, request.user, note)
            level = messages.SUCCESS if result.ok else messages.WARNING
            self.message_user(request, f"{run.pk}: {result.detail}", level)
        return None

    @admin.action(description="Cancel selected runs", permissions=["cancel"])
    def cancel_selected(self, request, queryset):
        for run in queryset:
            result = operator_actions.cancel(run, request.user)
            level = messages.SUCCESS if result.ok else messages.WARNING
            self.message_user(request, f"{run.pk}: {result.detail}", level)

    # --- operator pages -------------------------------------------------------------

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("start/", view(self.start_run_view), name="runs_start"),
            path("overview/", view(self.overview_view), name="runs_overview"),
            path("write-audits/", view(self.write_audits_view), name="runs_write_audits"),
            *self.approval_urls(),
            *[
                path(
                    f"<uuid:run_id>/{action}/",
                    view(self.operator_action_view),
                    {"action": action},
                    name=f"runs_{action}",
                )
                for action in RUN_ACTIONS
            ],
            *super().get_urls(),
        ]

    def _context(self, request, title):
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.model._meta,
            "queues_url": "/admin/django-rq/" if settings.REDIS_URL else "",
        }

    def start_run_view(self, request):
        return start_run_page(self, request)

    def overview_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        return TemplateResponse(
            request,
            "admin/runs/overview.html",
            {
                **self._context(request, "Runs overview"),
                **console.overview(),
                "spend": spend_overview(),
                "can_view_spend": request.user.has_perm("spend.view_dailyspend"),
            },
        )

    def write_audits_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        return TemplateResponse(
            request,
            "admin/runs/write_audits.html",
            {
                **self._context(request, "Failed write audits and writes in doubt"),
                "rows": console.write_audits(),
                "can_reconcile": self.has_reconcile_permission(request),
            },
        )

    def operator_action_view(self, request, run_id, action):
        """POST-only endpoint of the detail page's buttons and forms."""
        if action not in RUN_ACTIONS:
            raise Http404(f"no action {action!r}")
        if request.method != "POST":
            return redirect(reverse("admin:runs_agentrun_change", args=[run_id]))
        permission, perform = RUN_ACTIONS[action]
        if not getattr(self, permission)(request):
            raise PermissionDenied
        run = get_object_or_404(AgentRun, pk=run_id)
        try:
            result = perform(run, request.user, request.POST)
        except DatabaseError:
            # The action and its step are one transaction: nothing happened.
            logger.exception("run=%s %s failed on a database error", run_id, action)
            self.message_user(
                request,
                "The database could not complete the action; nothing was changed.",
                messages.ERROR,
            )
        else:
            level = messages.SUCCESS if result.ok else messages.ERROR
            self.message_user(request, result.detail, level)
        back = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
            back = reverse("admin:runs_agentrun_change", args=[run_id])
        return redirect(back)


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
