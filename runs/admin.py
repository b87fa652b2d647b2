"""Read-only admin pages for runs, steps and dead letters.

The full operator console (requeue, reconcile, overview) is a later issue;
these pages only let an operator look, and never edit history.
"""

from django.contrib import admin

from runs.models import AgentRun, DeadLetter, RunStep


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class RunStepInline(admin.TabularInline):
    model = RunStep
    fields = [
        "sequence",
        "kind",
        "tool_name",
        "effect",
        "arguments",
        "result",
        "error",
        "lease_token",
    ]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(AgentRun)
class AgentRunAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "status",
        "termination_reason",
        "failure_class",
        "mode",
        "pending_effect",
        "requeue_count",
        "created_at",
    ]
    list_filter = ["status", "termination_reason", "failure_class", "mode", "pending_effect"]
    search_fields = ["=id", "prompt"]
    show_full_result_count = False
    inlines = [RunStepInline]


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    list_display = ["run", "reason", "failure_class", "error_type", "created_at"]
    list_filter = ["reason", "failure_class"]
