"""Tools in the admin: operators switch them on and off and set their
approval policy; the effect is shown from the code and cannot be edited
(there is no field for it).

The approval policy is changed on a tool's own page only, through
``tools.approval_settings.set_approval_policy`` (which checks the
relaxation permission and writes the log entry), never in the list: the
list's inline edit saves rows without a note and reports a refused row
tersely, so there it is shown, not edited.
"""

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import override as translation_override

from nrllm_ops.admin_site import ReadOnly
from nrllm_ops.commits import reaching_disk
from tools import admin_display as display
from tools import approval_settings
from tools.models import Note, OutboxNotification, ToolSetting
from tools.operator_view import setting_for, sync_tool_settings
from tools.registry import effect_for

#: Form fields whose change ``set_approval_policy`` logs itself.
_APPROVAL_FIELDS = ("approval", "note")


class ToolSettingForm(forms.ModelForm):
    """A tool's switch and approval policy. ``operator`` (set by the admin
    for each request) is who submits it: a relaxation they may not make is
    a form error, and nothing is saved."""

    operator = None

    note = forms.CharField(
        required=False,
        max_length=approval_settings.MAX_NOTE_CHARS,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Why: recorded in the admin log with a change of approval.",
    )

    class Meta:
        model = ToolSetting
        fields = ["enabled", "approval"]
        labels = {"approval": "approval setting"}
        help_texts = {
            "approval": "default: what the tool's effect and NRLLM_APPROVAL_REQUIRED_FOR say. "
            "not_required on a tool whose default asks for approval lets its writes run "
            "unattended and needs the permission “Can let a tool whose effect needs approval "
            "by default run without it”.",
        }

    def clean_approval(self):
        policy = self.cleaned_data["approval"]
        # The instance still holds the stored value here (the form copies
        # its data onto it after cleaning).
        refused = approval_settings.policy_refusal(
            effect_for(self.instance.name),
            self.operator,
            policy,
            current=self.instance.approval,
        )
        if refused is not None:
            raise forms.ValidationError(refused.detail, code=refused.code)
        return policy

    def clean_note(self):
        note = self.cleaned_data["note"]
        problem = approval_settings.note_problem(note)
        if problem:
            raise forms.ValidationError(f"The note {problem}.")
        if note and "approval" not in self.changed_data:
            # Said, not dropped: only a change of approval carries a note.
            raise forms.ValidationError("A note goes with a change of the approval setting.")
        return note


@admin.register(ToolSetting)
class ToolSettingAdmin(admin.ModelAdmin):
    """The tools page. An MCP tool shows its server, the effect its toolset
    declares (or that it declares none), whether it can be offered now and
    why not, and the server's hints beside the declaration, flagged where
    they contradict it. The list syncs the settings rows first
    (``sync_tool_settings``), so an undeclared tool a server offers can be
    switched off here; a server is asked through the catalog's cache only,
    and one that cannot be reached leaves its tools shown unavailable."""

    form = ToolSettingForm
    #: The description is on each tool's page: the list is for the switch,
    #: and for the effect beside the approval in effect and the server's
    #: hints. In the order an operator reads a row, so that at 1366 px (the
    #: app list and the filters open) what decides a call — effect,
    #: approval, switch — comes first, source and availability share a
    #: column, and the longer text wraps
    #: (templates/admin/tools/toolsetting/change_list.html).
    list_display = [
        "name",
        "effect",
        "approval_policy",
        "enabled",
        "source_and_availability",
        "hints",
    ]
    list_editable = ["enabled"]
    list_filter = [display.SourceFilter, display.FlaggedFilter, display.AvailableFilter]
    fields = [
        "name",
        "source",
        "description",
        "effect",
        "hints",
        "availability",
        "parameters",
        "approval_policy",
        "enabled",
        "approval",
        "note",
    ]
    #: Everything but the operator's own switches is shown, never edited.
    readonly_fields = [name for name in fields if name not in ("enabled", "approval", "note")]

    @admin.display(description="source")
    def source(self, obj):
        return display.source_html(display.view_of(obj))

    @admin.display(description="description")
    def description(self, obj):
        view = display.view_of(obj)
        if not view.registered:
            return "(no longer registered)"
        return view.description

    @admin.display(description="effect (from code)")
    def effect(self, obj):
        return display.effect_html(display.view_of(obj))

    @admin.display(description="server's hints (untrusted)")
    def hints(self, obj):
        return display.hints_html(display.view_of(obj))

    @admin.display(description="source · availability")
    def source_and_availability(self, obj):
        """Where the tool comes from and whether it can be offered now: one
        column of the list, not two (the page has each on its own)."""
        view = display.view_of(obj)
        return format_html("{}<br>{}", display.source_html(view), display.availability_html(view))

    @admin.display(description="availability")
    def availability(self, obj):
        return display.availability_html(display.view_of(obj))

    @admin.display(description="input schema")
    def parameters(self, obj):
        return display.parameters_html(display.view_of(obj))

    @admin.display(description="approval (in effect)")
    def approval_policy(self, obj):
        return approval_settings.describe_policy(effect_for(obj.name), obj.approval)

    def changelist_view(self, request, extra_context=None):
        sync_tool_settings()
        return super().changelist_view(request, extra_context)

    def get_object(self, request, object_id, from_field=None):
        if from_field is None:
            setting_for(object_id)  # an undeclared MCP tool no list has synced
        return super().get_object(request, object_id, from_field)

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        if not self.has_change_permission(request, obj):
            return [name for name in fields if name != "note"]  # nothing to note
        return fields

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"operator": request.user})

    def save_model(self, request, obj, form, change):
        """Save the switch; hand a change of approval to
        ``set_approval_policy``, which checks it again under the row's lock
        and logs it. The admin's transaction holds both: a refusal there (a
        permission withdrawn since the form was checked) saves neither."""
        with reaching_disk():  # in the admin's transaction: its commit waits
            obj.save(update_fields=["enabled", "updated_at"])
        if "approval" not in form.changed_data:
            return
        result = approval_settings.set_approval_policy(
            obj,
            request.user,
            form.cleaned_data["approval"],
            form.cleaned_data.get("note", ""),
            via=approval_settings.VIA_ADMIN,
        )
        if not result.ok:
            raise PermissionDenied(result.detail)

    def construct_change_message(self, request, form, formsets, add=False):
        """The fields changed other than the approval (logged on its own by
        ``set_approval_policy``); None when that was the only change."""
        others = [name for name in form.changed_data if name not in _APPROVAL_FIELDS]
        if not others:
            return None if "approval" in form.changed_data else []
        with translation_override(None):
            labels = [str(form.fields[name].label or name) for name in others]
        return [{"changed": {"fields": labels}}]

    def log_change(self, request, obj, message):
        if message is None:
            return None  # set_approval_policy's entry says it all
        return super().log_change(request, obj, message)

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


admin.site.register(Note)


@admin.register(OutboxNotification)
class OutboxNotificationAdmin(ReadOnly, admin.ModelAdmin):
    """What ``send_notification`` appended, a row per call: the record of a
    non-idempotent write to check a run against (one per key, G10). Read
    only: no one adds, edits or deletes the outbox by hand."""

    list_display = ["created_shown", "recipient", "message_shown", "run", "key"]
    search_fields = ["=run_id", "recipient", "=idempotency_key"]
    readonly_fields = ["created_shown", "recipient", "message", "run_page", "idempotency_key"]
    fields = readonly_fields
    show_full_result_count = False

    @admin.display(description="created", ordering="created_at")
    def created_shown(self, notification):
        # To the second, with the zone: it is compared with a run's steps
        # and with logs (the admin's own format has neither).
        return timezone.localtime(notification.created_at).strftime("%Y-%m-%d %H:%M:%S %Z")

    @admin.display(description="message")
    def message_shown(self, notification):
        return notification.message[:120] + ("…" if len(notification.message) > 120 else "")

    # Ids and keys are cut to their head in the list (the whole in a
    # tooltip, and on the row's page): at 1366 px a whole key left the
    # message a column a word wide.
    @admin.display(description="run")
    def run(self, notification):
        url = reverse("admin:runs_agentrun_change", args=[notification.run_id])
        run_id = str(notification.run_id)
        return format_html('<a href="{}" title="{}">{}…</a>', url, run_id, run_id[:8])

    @admin.display(description="run")
    def run_page(self, notification):
        url = reverse("admin:runs_agentrun_change", args=[notification.run_id])
        return format_html('<a href="{}">{}</a>', url, notification.run_id)

    @admin.display(description="idempotency key")
    def key(self, notification):
        key = notification.idempotency_key
        return format_html('<code title="{}">{}…</code>', key, key[:12])
