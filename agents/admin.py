"""Agents in the admin: define one, change it (each change a new version),
and read every version as it was. Saving goes through
``agents.versions.save_agent``, as the API does: the same checks refuse a
definition with the same words, nothing is stored when they do, and each
save is an admin log entry naming the version it made. Agents and their
versions are never deleted here: runs name them."""

import json

from django import forms
from django.contrib import admin, messages
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from agents.definitions import FIELDS, InvalidDefinition, check_definition
from agents.models import Agent, AgentVersion
from agents.versions import AgentChanged, AgentConflict, save_agent
from nrllm_ops.admin_site import ReadOnly
from runs.admin.display import moment
from runs.admin.start_run import tool_choices


class AgentForm(forms.ModelForm):
    """The agent's name and description, and its definition's fields, shown
    from its latest version; a save checks them (``check_definition``)."""

    instructions = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "cols": 80}),
        help_text="the system message every run of the agent sends first",
    )
    provider = forms.JSONField(
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80}),
        help_text='as a run request\'s: {"kind": "openai", "model": "gpt-4.1-mini"}, or '
        '{"kind": "scripted", "turns": [...]}',
    )
    tools = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, help_text="what the model may call"
    )
    require_approval = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="tools among those above whose calls always wait for approval",
    )
    max_iterations = forms.IntegerField(required=False, help_text="blank: the deployment's cap")
    max_total_tokens = forms.IntegerField(required=False, help_text="blank: none of its own")
    max_cost = forms.CharField(
        required=False, max_length=40, help_text='e.g. "2.50"; blank: none of its own'
    )
    webhook = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.TextInput(attrs={"size": 80}),
        help_text="told when each run ends (its host must be in NRLLM_HTTP_ALLOWED_HOSTS)",
    )
    #: The version the page showed: a save after another change since is
    #: refused, not made on the old version (which would undo that change).
    based_on = forms.IntegerField(required=False, min_value=0, widget=forms.HiddenInput)

    class Meta:
        model = Agent
        fields = ["name", "description"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        names = [choice.name for choice in tool_choices()]
        latest = self.instance.latest if self.instance.pk else None
        if latest is not None:
            # A tool the version names that is gone or disabled stays shown.
            names += [name for name in latest.tools if name not in names]
            self.initial.setdefault("based_on", latest.number)
            for name, value in latest.definition().items():
                self.initial.setdefault(name, value if value is not None else "")
        for name in ("tools", "require_approval"):
            self.fields[name].choices = [(tool, tool) for tool in names]
        if "name" in self.fields and self.instance.pk:
            self.fields["name"].disabled = True

    def definition(self) -> dict:
        data = self.cleaned_data
        return {
            name: data.get(name) if data.get(name) not in ("", []) else None
            for name in FIELDS
            if name in data
        } | {"tools": data.get("tools", []), "require_approval": data.get("require_approval", [])}

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        latest = self.instance.latest if self.instance.pk else None
        based_on = cleaned.get("based_on")
        if latest is not None and based_on is not None and based_on != latest.number:
            self.add_error(None, _changed_since(self.instance, based_on))
            return cleaned
        try:
            check_definition(self.definition())
        except InvalidDefinition as error:
            self.add_error(_field_of(str(error)), str(error))
        return cleaned


def _changed_since(agent: Agent, based_on: int) -> str:
    return (
        f"{agent.name} was changed since this page showed version {based_on} (its latest "
        f"is version {agent.latest.number}): reload the page and make your change on that one."
    )


def _field_of(message: str) -> str | None:
    """The form field a refusal names (``tools: unknown …``), or None."""
    field = message.partition(":")[0].split("/")[0]
    return field if field in FIELDS else None


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    form = AgentForm
    list_display = ("name", "description", "latest_shown", "updated_at")
    search_fields = ("name", "description")
    fieldsets = [
        (None, {"fields": ["name", "description", "based_on"]}),
        (
            "Definition (saved as a new version; runs keep the version they started from)",
            {"fields": list(FIELDS)},
        ),
    ]
    #: Shown on an agent's page, under its definition (not on the add page).
    versions_fieldset = ("Versions", {"fields": ["versions_shown"]})
    readonly_fields = ["versions_shown"]

    def get_fieldsets(self, request, obj=None):
        return self.fieldsets + ([self.versions_fieldset] if obj is not None else [])

    def get_form(self, request, obj=None, change=False, **kwargs):
        # The form's fields are declared; Django must not derive them from
        # the fieldsets, which name the read-only list of versions too.
        kwargs["fields"] = ["name", "description"]
        return super().get_form(request, obj, change, **kwargs)

    @admin.display(description="versions")
    def versions_shown(self, agent: Agent) -> str:
        """Every version, newest first, each linked to its page as it was saved."""
        rows = format_html_join(
            "",
            '<li><a href="{}">v{}</a> — {} by {}</li>',
            (
                (
                    reverse("admin:agents_agentversion_change", args=[version.pk]),
                    version.number,
                    moment(version.created_at),
                    version.created_by or "the command line",
                )
                for version in agent.versions.select_related("created_by").order_by("-number")
            ),
        )
        return format_html('<ul class="agent-versions">{}</ul>', rows)

    @admin.display(description="latest version")
    def latest_shown(self, agent: Agent) -> str:
        return f"v{agent.latest.number}" if agent.latest else "—"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("latest")

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # runs name its versions

    def save_model(self, request, obj, form, change):
        try:
            agent, _, _ = save_agent(
                obj.name,
                form.definition(),
                description=obj.description,
                user=request.user,
                create=not change,
                based_on=form.cleaned_data.get("based_on") if change else None,
            )
        except (InvalidDefinition, AgentConflict) as error:
            # Checked in the form already; a race (a tool disabled, a name
            # taken, another change saved meanwhile) lands here, and nothing
            # was saved.
            if isinstance(error, AgentChanged):
                error = _changed_since(Agent.objects.get(pk=obj.pk), form.cleaned_data["based_on"])
            self.message_user(request, f"Not saved: {error}", messages.ERROR)
            obj.not_saved = True
            return
        obj.pk, obj.latest = agent.pk, agent.latest
        obj._state.adding = False

    def response_add(self, request, obj, post_url_continue=None):
        if obj.pk is None:  # refused in save_model: the message says why
            return redirect(reverse("admin:agents_agent_add"))
        return super().response_add(request, obj, post_url_continue)

    def response_change(self, request, obj):
        if getattr(obj, "not_saved", False):  # refused in save_model: the message says why
            return redirect(reverse("admin:agents_agent_change", args=[obj.pk]))
        return super().response_change(request, obj)

    def save_related(self, request, form, formsets, change):
        pass  # the versions are inserted by save_agent, never edited here

    # save_agent writes the log entry, naming the version it made.
    def log_addition(self, request, obj, message):
        return None

    def log_change(self, request, obj, message):
        return None


@admin.register(AgentVersion)
class AgentVersionAdmin(ReadOnly, admin.ModelAdmin):
    """Every version as it was saved: read-only, for anyone who may view agents."""

    list_display = ("__str__", "created_by", "created_at")
    list_filter = ("agent",)
    fields = ("agent", "number", "definition_shown", "created_by", "created_at")
    readonly_fields = fields

    @admin.display(description="definition")
    def definition_shown(self, version: AgentVersion) -> str:
        text = json.dumps(version.definition(), indent=2, ensure_ascii=False)
        return format_html("<pre>{}</pre>", text)

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("agents.view_agent") or super().has_view_permission(
            request, obj
        )
