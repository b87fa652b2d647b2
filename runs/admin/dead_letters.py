"""Dead letters in the admin: the open ones first; requeue or dismiss them."""

from django.contrib import admin, messages
from django.db.models import F
from django.template.response import TemplateResponse
from django.utils.timesince import timesince

from nrllm_ops.admin_site import ReadOnly
from runs.admin.display import shortened
from runs.admin.runs import OperatorPermissions
from runs.models import DeadLetter
from runs.operators import actions as operator_actions


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
    list_display = [
        "run",
        "reason",
        "failure_class",
        "error",
        "age",
        "resolution",
        "resolved_by",
        "resolved_at",
    ]
    list_filter = [OpenFilter, "reason", "failure_class", "resolution"]
    list_select_related = ["run", "resolved_by"]
    search_fields = ["=run__id"]
    actions = ["requeue_selected", "dismiss_selected"]
    readonly_fields = [field.name for field in DeadLetter._meta.fields]
    show_full_result_count = False

    def get_ordering(self, request):
        # The open ones first, newest first (the partial index on open ones).
        return [F("resolved_at").asc(nulls_first=True), "-created_at"]

    def has_dismiss_permission(self, request, obj=None):
        return request.user.has_perm("runs.dismiss_deadletter")

    @admin.display(description="error")
    def error(self, dead_letter):
        text = shortened(f"{dead_letter.error_type}: {dead_letter.error_message}".strip(": "))
        return text["short"] + ("…" if text["cut"] else "")

    @admin.display(description="age", ordering="created_at")
    def age(self, dead_letter):
        return timesince(dead_letter.created_at)

    @admin.action(description="Requeue the runs of selected dead letters", permissions=["requeue"])
    def requeue_selected(self, request, queryset):
        for dead_letter in queryset.select_related("run"):
            result = operator_actions.requeue(dead_letter.run, request.user, "from dead letter")
            level = messages.SUCCESS if result.ok else messages.WARNING
            self.message_user(request, f"{dead_letter.run_id}: {result.detail}", level)

    @admin.action(description="Dismiss selected dead letters", permissions=["dismiss"])
    def dismiss_selected(self, request, queryset):
        note = request.POST.get("note", "")
        if request.POST.get("confirm") != "yes" or not note.strip():
            return TemplateResponse(
                request,
                "admin/runs/deadletter/dismiss_confirmation.html",
                {
                    **self.admin_site.each_context(request),
                    "title": "Dismiss dead letters",
                    "opts": self.model._meta,
                    "dead_letters": queryset.select_related("run"),
                    "note_missing": request.POST.get("confirm") == "yes",
                    "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
                },
            )
        for dead_letter in queryset:
            result = operator_actions.dismiss(dead_letter, request.user, note)
            level = messages.SUCCESS if result.ok else messages.WARNING
            self.message_user(request, f"dead letter {dead_letter.pk}: {result.detail}", level)
        return None
