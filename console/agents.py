"""Agents in the admin: define one, change it (each change a new version),
and read every version as it was. Saving goes through
``agents.versions.save_agent``, as the API does: the same checks refuse a
definition with the same words, nothing is stored when they do, and each
save is an admin log entry naming the version it made. Agents and their
versions are never deleted here: runs name them.

The provider is asked for as fields (``console.agent_provider``), not as
JSON; an agent's page links "Start a run" to the start form, the agent
chosen."""

import json
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from agents.definitions import FIELDS, InvalidDefinition, check_definition
from agents.models import Agent, AgentVersion
from agents.versions import AgentChanged, AgentConflict, AgentForbidden, save_agent
from console.agent_provider import (
    OPTION_FIELDS,
    OTHER_OPTIONS,
    TURNS_HELP,
    default_kind,
    field_of_refusal,
    initial_of,
    kind_choices,
    number,
    provider_of,
    sent_as_shown,
    takes,
    values_of,
)
from console.display import moment
from console.site import ReadOnly
from console.start_run import TURNS_EXAMPLE, parsed_json, priced_models, tool_choices
from console.team_scope import ScopedRelatedFilter, TeamColumn
from teams import access
from teams.models import Team

ADD_AGENT = "agents.add_agent"


class AgentForm(forms.ModelForm):
    """The agent's name and description, and its definition's fields, shown
    from its latest version; a save checks them (``check_definition``)."""

    instructions = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "cols": 80}),
        help_text="the system message every run of the agent sends first",
    )
    # The provider, as fields (console.agent_provider): a version holds them
    # as the provider's JSON, as a run request's ``provider``.
    provider = forms.ChoiceField(
        help_text="what plays the model's turns: openai (any chat-completions endpoint), "
        "or scripted turns, for demos and tests"
    )
    model = forms.CharField(
        required=False,
        # The page's <datalist> of priced models.
        widget=forms.TextInput(attrs={"list": "priced-models", "size": 40}),
        help_text="the model the provider is asked for (priced models are suggested)",
    )
    temperature = forms.CharField(
        required=False,
        max_length=40,
        widget=forms.TextInput(attrs={"size": 8, "inputmode": "decimal"}),
        help_text="from 0 to 2; blank: the model's own",
    )
    max_tokens = forms.IntegerField(
        required=False,
        label="Max tokens per answer",
        help_text="the most tokens one answer may have; blank: NRLLM_RESERVE_MAX_TOKENS "
        "where a limit or budget needs one",
    )
    turns = forms.CharField(
        required=False,
        label="Scripted turns",
        widget=forms.Textarea(attrs={"rows": 5, "cols": 80}),
        help_text=TURNS_HELP,
    )
    provider_options = forms.CharField(
        required=False,
        label="Other provider options",
        widget=forms.Textarea(attrs={"rows": 2, "cols": 80}),
        help_text="a JSON object of the provider's options the fields above do not set "
        "(none of the shipped providers has any); blank: none",
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
    #: The team a new agent belongs to, among those where the user may
    #: author agents; shown, not changed, afterwards (G22: a row's team
    #: never changes, and the database refuses it).
    team = forms.ModelChoiceField(
        queryset=Team.objects.none(),
        required=False,
        to_field_name="slug",
        help_text="its runs are this team's; it cannot be changed after the agent is created",
    )
    #: The version the page showed: a save after another change since is
    #: refused, not made on the old version (which would undo that change).
    based_on = forms.IntegerField(required=False, min_value=0, widget=forms.HiddenInput)

    class Meta:
        model = Agent
        fields = ["name", "description"]

    #: Set by ``AgentAdmin.get_form``: the user the form is for.
    user = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._show_team()
        names = [choice.name for choice in tool_choices()]
        latest = self.instance.latest if self.instance.pk else None
        if latest is not None:
            # A tool the version names that is gone or disabled stays shown.
            names += [name for name in latest.tools if name not in names]
            self.initial.setdefault("based_on", latest.number)
            for name, value in latest.definition().items():
                if name != "provider":
                    self.initial.setdefault(name, value if value is not None else "")
        self._show_provider(latest.provider if latest is not None else None)
        #: What the page shows, as the agent holds it: a field sent back
        #: as shown keeps it (``_as_stored``).
        self.stored = {}
        if latest is not None:
            self.stored = {
                "description": self.instance.description,
                "instructions": latest.instructions,
                "webhook": latest.webhook,
                **values_of(latest.provider),
            }
        for name in ("tools", "require_approval"):
            self.fields[name].choices = [(tool, tool) for tool in names]
        if "name" in self.fields and self.instance.pk:
            self.fields["name"].disabled = True

    def _show_team(self) -> None:
        """On the add page, the teams where the user may author agents (the
        only one chosen); afterwards, the agent's own, read-only."""
        field = self.fields["team"]
        if self.instance.pk:
            field.queryset = Team.objects.filter(pk=self.instance.team_id)
            field.initial = self.instance.team.slug
            field.disabled = True
            return
        field.queryset = access.scoped(Team.objects.all(), self.user, ADD_AGENT)
        teams = list(field.queryset[:2])
        #: The one team the user may author agents in: the team of a new
        #: agent whose form names none (sent by a script, say).
        self.only_team = teams[0] if len(teams) == 1 else None
        if self.only_team is not None:
            self.initial.setdefault("team", self.only_team.slug)

    def team_of_agent(self) -> Team | None:
        """The team the agent is (or will be) in."""
        if self.instance.pk:
            return self.instance.team
        return self.cleaned_data.get("team") or self.only_team

    def _show_provider(self, provider: dict | None) -> None:
        """The provider's fields as ``provider`` (a version's) sets them; a
        new agent's as the first configured kind, with turns to change."""
        if provider is not None:
            for name, value in initial_of(provider).items():
                self.initial.setdefault(name, value)
        else:
            kind = default_kind()
            self.initial.setdefault("provider", kind)
            if "turns" in takes(kind):
                # A new agent's turns start as a valid example to change.
                self.initial.setdefault("turns", TURNS_EXAMPLE)
        # Tall enough for the turns shown, a turn a line (long ones wrap).
        shown_lines = str(self.initial.get("turns", "")).count("\n") + 2
        self.fields["turns"].widget.attrs["rows"] = min(max(shown_lines, 5), 16)
        self.fields["provider"].choices = kind_choices(self.initial.get("provider"))
        # The page's script shows only the fields the chosen kind takes.
        self.fields["provider"].widget.attrs["data-takes"] = json.dumps(
            {kind: takes(kind) for kind, _ in self.fields["provider"].choices}
        )

    def clean_temperature(self):
        text = self.cleaned_data["temperature"]
        return number(text) if text else None

    def clean_turns(self):
        text = self.cleaned_data["turns"]
        return parsed_json(text) if text else None

    def clean_provider_options(self):
        text = self.cleaned_data["provider_options"]
        options = parsed_json(text) if text else {}
        if not isinstance(options, dict):
            raise forms.ValidationError('a JSON object, e.g. {"top_p": 0.9}; blank: none')
        return options

    def _as_stored(self) -> None:
        """Each field sent back as the page showed it holds the agent's
        value, byte for byte: read from what a browser sends, a value
        written 40.0, lines ending LF or a space at either end would come
        back otherwise, and a page saved unchanged make a version (or
        rewrite the description) differing from the one it showed."""
        for name, value in self.stored.items():
            sent = self.data.get(self.add_prefix(name))
            shown = str(self.initial.get(name, ""))
            lines = isinstance(self.fields[name].widget, forms.Textarea)
            if name in self.cleaned_data and sent_as_shown(sent, shown, lines=lines):
                self.cleaned_data[name] = value

    def definition(self) -> dict:
        data = self.cleaned_data
        return {
            name: data.get(name) if data.get(name) not in ("", []) else None
            for name in FIELDS
            if name in data and name != "provider"
        } | {
            "provider": self.provider,
            "tools": data.get("tools", []),
            "require_approval": data.get("require_approval", []),
        }

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        self._as_stored()
        self.provider = provider_of(self)
        if self.provider is None:  # a field its kind does not take: named
            return cleaned
        latest = self.instance.latest if self.instance.pk else None
        based_on = cleaned.get("based_on")
        if latest is not None and based_on is not None and based_on != latest.number:
            self.add_error(None, _changed_since(self.instance, based_on))
            return cleaned
        try:
            check_definition(self.definition())
        except InvalidDefinition as error:
            message = str(error)
            self.add_error(field_of_refusal(message) or _field_of(message), message)
            return cleaned
        team = self.team_of_agent()
        if team is None:
            self.add_error("team", "team: choose the team the agent belongs to")
            return cleaned
        for name in self.definition()["tools"]:
            if team is not None and not team.may_use(name):
                # Its runs would be refused at enqueue: refused here, named.
                self.add_error("tools", f"tools: team {team.slug!r} may not use {name!r}")
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


def _shown_fields() -> list[str]:
    """The definition's fields in order, the provider as its fields."""
    fields = list(FIELDS)
    after = fields.index("provider") + 1
    return [*fields[:after], *OPTION_FIELDS, OTHER_OPTIONS, *fields[after:]]


@admin.register(Agent)
class AgentAdmin(TeamColumn, admin.ModelAdmin):
    form = AgentForm
    list_display = ("name", "description", "latest_shown", "updated_at")
    search_fields = ("name", "description")
    fieldsets = [
        (None, {"fields": ["name", "team", "description", "based_on"]}),
        (
            "Definition (saved as a new version; runs keep the version they started from)",
            {"fields": _shown_fields()},
        ),
    ]
    #: Shown on an agent's page, under its definition (not on the add page).
    versions_fieldset = ("Versions", {"fields": ["versions_shown"]})
    readonly_fields = ["versions_shown"]

    class Media:
        # Shows only the provider's fields its chosen kind takes.
        js = ["console/provider_fields.js"]

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        context["priced_models"] = priced_models()
        context["start_run_url"] = self.start_run_url(request, obj)
        return super().render_change_form(request, context, add, change, form_url, obj)

    def start_run_url(self, request, agent: Agent | None) -> str:
        """The start form with ``agent`` chosen, for whoever may start runs;
        "" on the add page and for an agent with no version to run."""
        if agent is None or agent.latest_id is None:
            return ""
        if not access.may(request.user, "runs.add_agentrun", agent.team_id):
            return ""
        return f"{reverse('admin:runs_start')}?{urlencode({'agent': agent.name})}"

    def get_fieldsets(self, request, obj=None):
        return self.fieldsets + ([self.versions_fieldset] if obj is not None else [])

    def get_form(self, request, obj=None, change=False, **kwargs):
        # The form's fields are declared; Django must not derive them from
        # the fieldsets, which name the read-only list of versions too.
        kwargs["fields"] = ["name", "description"]
        form = super().get_form(request, obj, change, **kwargs)
        return type(form.__name__, (form,), {"user": request.user})

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
                team=None if change else form.team_of_agent(),
            )
        except (InvalidDefinition, AgentConflict, AgentForbidden) as error:
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
    # The agents the user sees, not every agent of the deployment (G22).
    list_filter = (("agent", ScopedRelatedFilter),)
    #: Seen by whoever may view agents, in the agents' teams.
    team_view_permission = "agents.view_agent"
    fields = ("agent", "number", "definition_shown", "created_by", "created_at")
    readonly_fields = fields

    @admin.display(description="definition")
    def definition_shown(self, version: AgentVersion) -> str:
        text = json.dumps(version.definition(), indent=2, ensure_ascii=False)
        return format_html("<pre>{}</pre>", text)

    def has_view_permission(self, request, obj=None) -> bool:
        if obj is not None:
            return access.may(request.user, "agents.view_agent", access.team_id_of(obj))
        return request.user.has_perm("agents.view_agent") or super().has_view_permission(
            request, obj
        )
