"""What the forms of a schedule and an event trigger share (G22, G23): the
agent, among those where the user may add one (the team's authors); the
version, among that agent's (blank: its latest at each run). The owner,
whose runs they are, is whoever saves it: nobody makes their runs someone
else's (their budget, four-eyes), and a change of what the runs do is its
changer's. The model's ``clean()`` then says whether they may start the
agent's runs, and whether the version is the agent's.

An existing one keeps its agent: the agent is its team (G22), and a row
never moves to another team here."""

from zoneinfo import ZoneInfo

from django import forms
from django.contrib import admin
from django.contrib.admin.widgets import RelatedFieldWidgetWrapper
from django.core.exceptions import NON_FIELD_ERRORS

from agents.models import Agent, AgentVersion
from console.display import moment
from teams import access


class AgentOwnedForm(forms.ModelForm):
    """A ModelForm of a model with ``agent``, ``version`` and ``owner``."""

    #: Set by the model admin's ``get_form``: the user the form is for.
    user = None
    #: The permission a new one's agent is chosen by (``triggers.add_schedule``).
    add_permission = ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            agents = Agent.objects.filter(pk=self.instance.agent_id)
        else:
            agents = access.scoped(Agent.objects.all(), self.user, self.add_permission)
        if "agent" in self.fields:
            self.fields["agent"].queryset = agents.order_by("name")
            if self.instance.pk:
                self.fields["agent"].disabled = True
                self.fields["agent"].help_text = "its team's: it cannot be changed"
        if "version" in self.fields:
            versions = AgentVersion.objects.filter(agent__in=agents).select_related("agent")
            field = self.fields["version"]
            field.queryset = versions.order_by("agent__name", "-number")
            field.label_from_instance = lambda version: f"{version.agent.name} v{version.number}"
            field.empty_label = "— the agent's latest, at each run —"

    def _post_clean(self):
        # Before the model's clean(): it checks the owner may start the runs.
        self.instance.owner = self.user
        super()._post_clean()

    def _update_errors(self, errors):
        # The owner is no field of the form (it is whoever saves): what the
        # model says of it is said of the whole form.
        if hasattr(errors, "error_dict") and "owner" in errors.error_dict:
            owner = errors.error_dict.pop("owner")
            errors.error_dict.setdefault(NON_FIELD_ERRORS, []).extend(owner)
        super()._update_errors(errors)


class AgentOwnedAdmin:
    """Mixed into the model admin of an ``AgentOwnedForm``: the form is
    given its user, and the agent and the version are plain selects —
    not Django's links to add or change an agent from here (an agent's
    change is a new version: its own page)."""

    readonly_fields = ["owner_shown"]

    @admin.display(description="owner (whoever saves it: saving makes you its owner)")
    def owner_shown(self, obj) -> str:
        return obj.owner.get_username() if obj is not None and obj.owner_id else "you, once saved"

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        return type(form.__name__, (form,), {"user": request.user})

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if field is not None and isinstance(field.widget, RelatedFieldWidgetWrapper):
            field.widget = field.widget.widget
        return field


def both_clocks(instant, time_zone: str) -> dict:
    """``instant`` as the schedule's clock reads it and in UTC (to the
    second, with the zone, as ``moment`` writes it)."""
    local = instant.astimezone(ZoneInfo(time_zone)).strftime("%Y-%m-%d %H:%M:%S %Z")
    utc = moment(instant)
    return {"local": local, "utc": utc, "same": local == utc}
