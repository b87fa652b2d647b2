"""Dead letters in the admin: the open ones first; requeue or dismiss them,
from the list or from a dead letter's page.

Sized for a laptop (issue #30): a row names its run by its id's head
(linked), and its error wraps rather than being cut to the column.
Requeueing goes through the runs' own action — the same verdicts, the same
confirmation (with the warning when the failure would come again), the same
permission — and dismissing needs a note.
"""

from django.contrib import admin, messages
from django.db.models import F
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from console.bulk_actions import ACTION_PERMISSION, empty_filter_refused, too_many_selected
from console.display import cut, moment, short_id, span
from console.reconcile import reconcile_form
from console.run_actions import OperatorPermissions
from console.site import ReadOnly
from console.team_scope import role_needed
from console.write_in_doubt import described_write
from runs.models import AgentRun, DeadLetter
from runs.models.selectors import is_write_in_doubt, note_writes_in_doubt
from runs.operators import actions as operator_actions
from runs.operators import bulk
from runs.operators.bulk import BULK_ACTIONS
from runs.operators.lasting_failure import lasting_failure
from runs.operators.requeue_safety import requeue_safety
from teams import access

#: The error in a row (all of it on the dead letter's page).
ERROR_CHARS = 240


class OpenFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("open", "Open"), ("resolved", "Resolved")]

    def queryset(self, request, queryset):
        if self.value() == "open":
            return queryset.filter(resolved_at__isnull=True)
        if self.value() == "resolved":
            return queryset.filter(resolved_at__isnull=False)
        return queryset


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnly, OperatorPermissions, admin.ModelAdmin):
    list_display = ["number", "run_link", "reason", "failure_class", "error_shown", "age", "state"]
    list_display_links = ["number"]
    list_filter = [OpenFilter, "reason", "failure_class", "resolution"]
    list_select_related = ["run", "resolved_by"]
    search_fields = ["=run__id"]
    search_help_text = "Searches a whole run id."
    actions = ["requeue_selected", "dismiss_selected"]
    fields = [
        "run_link",
        "reason",
        "failure_class",
        "error_type",
        "error_message",
        "created_shown",
        "resolution",
        "resolved_by",
        "resolved_shown",
        "resolution_note",
    ]
    readonly_fields = fields
    show_full_result_count = False

    def get_queryset(self, request):
        # A row says whether its run's write is in doubt: the runs'
        # reconciliations in one query for the page, not one per row.
        return super().get_queryset(request).prefetch_related("run__reconciliations")

    def changelist_view(self, request, extra_context=None):
        response = super().changelist_view(request, extra_context)
        changelist = (getattr(response, "context_data", None) or {}).get("cl")
        if changelist is not None:
            # The runs' idempotent writes in one query for the page.
            note_writes_in_doubt([dead_letter.run for dead_letter in changelist.result_list])
        return response

    def get_ordering(self, request):
        # The open ones first, newest first (the partial index on open ones).
        return [F("resolved_at").asc(nulls_first=True), "-created_at"]

    def has_dismiss_permission(self, request, obj=None):
        return self._may_act(request, "dismiss", obj)

    # --- columns and fields -------------------------------------------------------

    @admin.display(description="#", ordering="pk")
    def number(self, dead_letter):
        return f"#{dead_letter.pk}"

    @admin.display(description="run")
    def run_link(self, dead_letter):
        url = reverse("admin:runs_agentrun_change", args=[dead_letter.run_id])
        return format_html(
            '<a href="{}" title="{}"><code class="run-id">{}</code></a> ({})',
            url,
            dead_letter.run_id,
            short_id(dead_letter.run_id),
            dead_letter.run.status,
        )

    @admin.display(description="error")
    def error_shown(self, dead_letter):
        """The error; for an open dead letter whose run has a write in doubt,
        that in words — the tool, why, where to go — and the error in the
        tooltip (its class is no words for an operator)."""
        parts = (dead_letter.error_type, dead_letter.error_message)
        error = ": ".join(part for part in parts if part)
        run = dead_letter.run
        if dead_letter.resolved_at is None and is_write_in_doubt(run):
            write = described_write(run, with_late_result=False)
            return format_html(
                '<span class="run-error doubt-words" title="{}"><strong>A write may have '
                'landed</strong>: <code class="tool-name">{}</code> {}. '
                '<a href="{}#write-in-question">Check it, then reconcile it</a>.</span>',
                cut(error, 600),
                write.tool,
                write.why_short,
                reverse("admin:runs_agentrun_change", args=[run.pk]),
            )
        return format_html(
            '<span class="run-error" title="{}">{}</span>', cut(error, 600), cut(error, ERROR_CHARS)
        )

    @admin.display(description="age", ordering="created_at")
    def age(self, dead_letter):
        return format_html(
            '<span title="opened {}">{}</span>',
            moment(dead_letter.created_at),
            span(timezone.now() - dead_letter.created_at, units=1),
        )

    @admin.display(description="state", ordering="resolved_at")
    def state(self, dead_letter):
        if dead_letter.resolved_at is None:
            return format_html("<strong>{}</strong>", "open")
        return format_html(
            '{} by {} <span title="{}">{} ago</span>',
            dead_letter.resolution,
            dead_letter.resolved_by,
            moment(dead_letter.resolved_at),
            span(timezone.now() - dead_letter.resolved_at, units=1),
        )

    @admin.display(description="opened")
    def created_shown(self, dead_letter):
        return moment(dead_letter.created_at)

    @admin.display(description="resolved")
    def resolved_shown(self, dead_letter):
        return moment(dead_letter.resolved_at) or "-"

    # --- the page ---------------------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The dead letter, with its run's requeue verdict and the buttons to
        requeue it (the runs' endpoint) or dismiss it (this list's action)."""
        dead_letter = self.get_object(request, object_id)
        if dead_letter is not None:
            run = dead_letter.run
            verdict = requeue_safety(run)
            extra_context = {
                **(extra_context or {}),
                "dead_letter": dead_letter,
                "run": run,
                # Its run's write in doubt: what to check, and the form.
                "write": described_write(run),
                "reconciliation": run.reconciliation,
                "can_reconcile": self.has_reconcile_permission(request, run),
                "reconcile_form": reconcile_form(run),
                "next": request.path,
                "verdict": verdict,
                "lasting_failure": lasting_failure(run) if verdict.allowed else "",
                "can_requeue": self.has_requeue_permission(request, run) and verdict.allowed,
                "can_dismiss": self.has_dismiss_permission(request, dead_letter)
                and dead_letter.resolved_at is None,
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            }
        return super().change_view(request, object_id, form_url, extra_context)

    # --- actions ----------------------------------------------------------------------

    @admin.action(description="Requeue the runs of selected dead letters", permissions=["requeue"])
    def requeue_selected(self, request, queryset):
        """The runs' own confirmation (each run's verdict, the warning where
        its failure would come again), confirmed to the runs' action."""
        # The runs of the teams where the user may requeue (G22); the
        # selection was already only what it sees.
        runs = access.scoped(
            AgentRun.objects.filter(pk__in=queryset.values("run_id")),
            request.user,
            ACTION_PERMISSION["requeue"],
        )
        run_admin = self.admin_site.get_model_admin(AgentRun)
        if refused := empty_filter_refused(request, self):
            self.message_user(request, refused, messages.ERROR)
            return None
        if not runs.exists():
            self.message_user(
                request,
                "Nothing was done: requeueing takes "
                f"{role_needed(ACTION_PERMISSION['requeue'])} in the team of each selected run.",
                messages.ERROR,
            )
            return None
        if bulk.too_many(runs):
            self.message_user(request, too_many_selected(), messages.ERROR)
            return None
        return run_admin.bulk_preview(
            request,
            BULK_ACTIONS["requeue"],
            bulk.runs_for_preview(runs),
            action_url=reverse("admin:runs_agentrun_changelist"),
            back_url=reverse("admin:runs_deadletter_changelist"),
        )

    @admin.action(description="Dismiss selected dead letters", permissions=["dismiss"])
    def dismiss_selected(self, request, queryset):
        # Only the dead letters of teams where the user may dismiss (G22).
        queryset = access.scoped(queryset, request.user, self.operator_permissions["dismiss"])
        note = request.POST.get("note", "")
        confirmed = request.POST.get("confirm") == "yes"
        if not confirmed and (refused := empty_filter_refused(request, self)):
            self.message_user(request, refused, messages.ERROR)
            return None
        if not confirmed or not note.strip():
            return TemplateResponse(
                request,
                "admin/runs/deadletter/dismiss_confirmation.html",
                {
                    **self.admin_site.each_context(request),
                    "title": "Dismiss dead letters",
                    "opts": self.model._meta,
                    "dead_letters": queryset.select_related("run"),
                    "note": note,
                    "note_missing": request.POST.get("confirm") == "yes",
                    "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
                },
            )
        for dead_letter in queryset:
            result = operator_actions.dismiss(dead_letter, request.user, note)
            level = messages.SUCCESS if result.ok else messages.WARNING
            self.message_user(request, f"Dead letter #{dead_letter.pk}: {result.detail}.", level)
        return None
