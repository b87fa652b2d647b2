"""Tools in the admin: operators switch them on and off and set their
approval policy; the effect is shown from the code and cannot be edited
(there is no field for it).

The approval policy is changed on a tool's own page only, through
``tools.approval_settings.set_approval_policy`` (which checks the
relaxation permission and writes the log entry), never in the list: the
list's inline edit saves rows without a note and reports a refused row
tersely, so there it is shown, not edited.

Each tool's row shows where it comes from, its availability and an MCP
server's hints beside the declared effect (``view_of`` and the helpers
below it), and the list filters by them.
"""

import json

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import override as translation_override

from console.site import ReadOnly
from ground.commits import reaching_disk
from tools import approval_settings
from tools.models import Note, OutboxNotification, ToolSetting
from tools.operator_view import ToolSource, ToolView, describe_tool, setting_for, sync_tool_settings
from tools.registry import effect_for

#: The flag beside a hint that contradicts the declaration.
FLAG = "⚠"
_FLAG_STYLE = "color:#ba2121;font-weight:bold"
_MUTED_STYLE = "color:var(--body-quiet-color,#666)"


def view_of(setting) -> ToolView:
    """The setting's tool as operators see it, described once per row object."""
    view = getattr(setting, "_tool_view", None)
    if view is None:
        view = setting._tool_view = describe_tool(setting.name)
    return view


def source_html(view: ToolView):
    if view.source is ToolSource.MCP:
        return format_html("MCP server <strong>{}</strong>", view.server)
    return {
        ToolSource.BUILTIN: "builtin",
        ToolSource.CLASS: "tool class",
        ToolSource.UNKNOWN: "(no longer registered)",
    }[view.source]


def effect_html(view: ToolView):
    if view.declared:
        return view.effect.value
    if view.source is ToolSource.MCP:
        return format_html(
            '{} <span style="{}">(undeclared: the riskiest effect)</span>',
            view.effect.value,
            _MUTED_STYLE,
        )
    return format_html('{} <span style="{}">(unknown name)</span>', view.effect.value, _MUTED_STYLE)


def availability_html(view: ToolView):
    if view.available:
        return "available"
    return format_html(
        '<span class="tool-unavailable" style="{}">unavailable:</span> {}',
        _FLAG_STYLE,
        view.unavailable_reason,
    )


def hints_html(view: ToolView):
    """The stated hints, then each contradiction flagged; "—" for none."""
    if view.source is not ToolSource.MCP:
        return "—"
    stated = (
        format_html_join(
            ", ", "{}: {}", ((name, json.dumps(value)) for name, value in view.hints.items())
        )
        if view.hints
        else format_html('<span style="{}">{}</span>', _MUTED_STYLE, _no_hints(view))
    )
    if not view.hint_contradictions:
        return stated
    flags = format_html_join(
        "",
        '<div class="hint-flag" style="{}">{} {}</div>',
        ((_FLAG_STYLE, FLAG, text) for text in view.hint_contradictions),
    )
    return format_html(
        '{}{}<div style="{}">the declaration wins</div>', stated, flags, _MUTED_STYLE
    )


def _no_hints(view: ToolView) -> str:
    return "none stated" if view.available else "not known (not listed now)"


def parameters_html(view: ToolView):
    if view.parameters is None:
        return "—"
    return format_html(
        '<pre style="white-space:pre-wrap">{}</pre>',
        json.dumps(view.parameters, indent=2, sort_keys=True, ensure_ascii=False),
    )


# --- filters -----------------------------------------------------------------------


class _ViewFilter(admin.SimpleListFilter):
    """A filter on what ``describe_tool`` says: the rows whose view matches."""

    def matches(self, view: ToolView) -> bool:
        raise NotImplementedError

    def queryset(self, request, queryset):
        if self.value() is None:
            return queryset
        names = [setting.name for setting in queryset if self.matches(view_of(setting))]
        return queryset.filter(name__in=names)


class SourceFilter(_ViewFilter):
    title = "source"
    parameter_name = "source"

    def lookups(self, request, model_admin):
        from tools.registry import get_registry

        servers = [(f"mcp:{t.server}", f"MCP server {t.server}") for t in get_registry().toolsets]
        return [("builtin", "builtin"), ("class", "tool class"), *servers, ("unknown", "unknown")]

    def matches(self, view):
        if view.source is ToolSource.MCP:
            return self.value() == f"mcp:{view.server}"
        return self.value() == view.source.value


class FlaggedFilter(_ViewFilter):
    title = "hints contradict the declaration"
    parameter_name = "flagged"

    def lookups(self, request, model_admin):
        return [("yes", "flagged"), ("no", "not flagged")]

    def matches(self, view):
        return view.flagged == (self.value() == "yes")


class AvailableFilter(_ViewFilter):
    title = "availability"
    parameter_name = "available"

    def lookups(self, request, model_admin):
        return [("yes", "available"), ("no", "unavailable")]

    def matches(self, view):
        return view.available == (self.value() == "yes")


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
    list_filter = [SourceFilter, FlaggedFilter, AvailableFilter]
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
        return source_html(view_of(obj))

    @admin.display(description="description")
    def description(self, obj):
        view = view_of(obj)
        if not view.registered:
            return "(no longer registered)"
        return view.description

    @admin.display(description="effect (from code)")
    def effect(self, obj):
        return effect_html(view_of(obj))

    @admin.display(description="server's hints (untrusted)")
    def hints(self, obj):
        return hints_html(view_of(obj))

    @admin.display(description="source · availability")
    def source_and_availability(self, obj):
        """Where the tool comes from and whether it can be offered now: one
        column of the list, not two (the page has each on its own)."""
        view = view_of(obj)
        return format_html("{}<br>{}", source_html(view), availability_html(view))

    @admin.display(description="availability")
    def availability(self, obj):
        return availability_html(view_of(obj))

    @admin.display(description="input schema")
    def parameters(self, obj):
        return parameters_html(view_of(obj))

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
