"""Runs in the admin: a read-only list and detail, and the operator pages
(overview, writes in doubt; the approvals inbox is console/approvals.py,
the actions and the run page's buttons console/run_actions.py)."""

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone

from console import figures as console
from console import live, search
from console.approvals import ApprovalsInbox
from console.bulk_actions import BulkRunActions
from console.filters import (
    CollapsedChoicesFilter,
    LeaseFilter,
    OffersToolFilter,
    RequeueCountFilter,
    WriteInDoubtFilter,
)
from console.paginator import BoundedCountPaginator
from console.queue_dashboard import may_see_queue
from console.rerun_page import rerun_page
from console.run_actions import RUN_ACTIONS, OperatorPermissions, RunActions
from console.run_columns import RunListColumns
from console.run_page import RunPageFields, run_page_context
from console.run_spend import RunSpendFields
from console.site import ReadOnly
from console.start_run import start_run_page
from console.team_scope import TeamColumn
from runs.models import AgentRun
from runs.models.selectors import note_writes_in_doubt


@admin.register(AgentRun)
class AgentRunAdmin(
    ReadOnly,
    OperatorPermissions,
    RunActions,
    BulkRunActions,
    ApprovalsInbox,
    live.LiveRunList,
    RunListColumns,
    RunPageFields,
    RunSpendFields,
    TeamColumn,
    admin.ModelAdmin,
):
    # What fits a laptop's pane (console/run_columns.py); the fence, the
    # lease, the mode and the requeues are on the run's page.
    list_display = [
        "run_id_shown",
        "prompt_shown",
        "status_shown",
        "submitter_shown",
        "model_shown",
        "age",
        "spend",
        "last_error",
    ]
    list_display_links = ["run_id_shown"]
    # The filters operators reach for open; the rarer ones folded (their
    # parameters still work: the overview's and the bench's links use them).
    # Mode, fence and finished are plain field lookups a URL may still ask.
    list_filter = [
        "status",
        "failure_class",
        WriteInDoubtFilter,
        OffersToolFilter,
        "created_at",
        ("termination_reason", CollapsedChoicesFilter),
        RequeueCountFilter,
        LeaseFilter,
    ]
    # What the search box searches; get_search_results (console/search.py)
    # does the searching.
    search_fields = ["=id", "prompt", "=lease_owner"]
    search_help_text = (
        "Searches a whole run id, words in the prompt (all of them; "
        '"quoted words" together), or a whole lease owner.'
    )
    ordering = ["-created_at"]
    paginator = BoundedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    actions = ["requeue_selected", "restart_selected", "cancel_selected"]
    # The run's error is the summary's (console/run_page.py): not again here.
    fieldsets = [
        (
            "Request",
            {
                "fields": [
                    "prompt",
                    "run_id_full",
                    "agent_shown",
                    "mode",
                    "submitted_by",
                    "submitted_via",
                    "request_shown",
                ]
            },
        ),
        (
            "Outcome",
            {
                "fields": [
                    "status",
                    "termination_reason",
                    "failure_class",
                    "model_time_shown",
                    "output",
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
            "Lease, fence and times",
            {
                "classes": ["collapse"],
                "fields": [
                    "fence_shown",
                    "lease_owner",
                    "lease_expires_shown",
                    "attempt_shown",
                    "requeues_shown",
                    "journal_shown",
                    "created_shown",
                    "started_shown",
                    "finished_shown",
                ],
            },
        ),
    ]

    # Everything shown is read-only: history is never edited here.
    readonly_fields = [name for _, options in fieldsets for name in options["fields"]]

    def get_queryset(self, request):
        # A write in doubt is shown on the list: its reconciliations in one
        # query for the page, not one per row; the submitter and the agent
        # version in the page's own query (joined), not one per row either.
        return (
            super()
            .get_queryset(request)
            .select_related("submitted_by", "agent_version__agent")
            .prefetch_related("reconciliations")
        )

    def changelist_view(self, request, extra_context=None):
        response = super().changelist_view(request, extra_context)
        changelist = (getattr(response, "context_data", None) or {}).get("cl")
        if changelist is not None:
            # The rows' "write in doubt" (runs.models.selectors): one query for the
            # page's idempotent writes, not one per row. The page's rows are
            # evaluated once and cached for the template.
            note_writes_in_doubt(changelist.result_list)
        return response

    def get_search_results(self, request, queryset, search_term):
        return search.search_runs(queryset, search_term), False

    def get_ordering(self, request):
        if search.is_text_search(request.GET.get("q", "")):
            return search.ordering()
        return super().get_ordering(request)

    # --- the detail page --------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # get_object() takes a malformed id (not a UUID) for a missing one.
        run = self.get_object(request, unquote(object_id))
        if run is None:
            return super().change_view(request, object_id, form_url)  # "does not exist"
        context = {
            **run_page_context(self, request, run),
            **live.live_context(live.run_in_flight(run)),
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, extra_context=context)

    # --- operator pages -------------------------------------------------------------

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("start/", view(self.start_run_view), name="runs_start"),
            path("overview/", view(self.overview_view), name="runs_overview"),
            path("write-audits/", view(self.write_audits_view), name="runs_write_audits"),
            *self.approval_urls(),
            path(
                "<uuid:run_id>/rerun-from/<int:sequence>/",
                view(self.rerun_from_view),
                name="runs_rerun_from",
            ),
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
            "queues_url": "/admin/django-rq/"
            if settings.REDIS_URL and may_see_queue(request.user)
            else "",
        }

    def rerun_from_view(self, request, run_id, sequence):
        return rerun_page(self, request, run_id, sequence)

    def start_run_view(self, request):
        return start_run_page(self, request)

    def overview_view(self, request):
        # The overview is the admin's index (console/overview.py): this
        # address, bookmarked, leads there, its query (?window=7d) kept.
        query = request.GET.urlencode()
        return redirect(f"{reverse('admin:index')}{'?' if query else ''}{query}")

    def write_audits_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        return TemplateResponse(
            request,
            "admin/runs/write_audits.html",
            {
                **self._context(request, "Failed write audits and writes in doubt"),
                "rows": console.write_audits(timezone.now(), request.user),
                "can_reconcile": self.has_reconcile_permission(request),
            },
        )
