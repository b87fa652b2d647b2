"""Write reconciliations in the admin: what operators found about writes
left in doubt (G13), read-only. They outlive their run (retention deletes
a run past its age, not its reconciliations), so this list is where an
auditor finds them after the run has gone; the run's id stays as a name."""

from django.contrib import admin
from django.db.models import Exists, OuterRef
from django.urls import reverse
from django.utils.html import format_html

from console.display import SHORT_CHARS, cut, short_id
from console.site import ReadOnly
from runs.models import AgentRun, WriteReconciliation


@admin.register(WriteReconciliation)
class WriteReconciliationAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["created_at", "run_link", "tool_name", "outcome", "operator", "note_head"]
    list_filter = ["outcome"]
    list_select_related = ["operator"]
    search_fields = ["=run__id", "=idempotency_key", "tool_name"]
    search_help_text = "A run's whole id, a call's idempotency key, or a tool's name."
    fields = readonly_fields = [
        "run_link",
        "lease_token",
        "tool_name",
        "arguments",
        "idempotency_key",
        "outcome",
        "note",
        "operator",
        "created_at",
    ]
    show_full_result_count = False

    def get_queryset(self, request):
        # Whether each run still exists, in the list's one query: the run
        # may have been deleted by retention.
        return (
            super()
            .get_queryset(request)
            .annotate(run_kept=Exists(AgentRun.objects.filter(pk=OuterRef("run_id"))))
        )

    @admin.display(description="run", ordering="run_id")
    def run_link(self, reconciliation):
        head = short_id(reconciliation.run_id)
        if not reconciliation.run_kept:
            return format_html(
                '<code title="{}">{}</code> (deleted by retention)', reconciliation.run_id, head
            )
        return format_html(
            '<a href="{}" title="{}"><code>{}</code></a>',
            reverse("admin:runs_agentrun_change", args=[reconciliation.run_id]),
            reconciliation.run_id,
            head,
        )

    @admin.display(description="note")
    def note_head(self, reconciliation):
        return cut(reconciliation.note, SHORT_CHARS)
