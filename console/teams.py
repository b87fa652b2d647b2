"""Teams and their members in the admin (G22).

A team admin (the ``team_admin`` role) sees and changes their teams'
members, the tools the team may use and the tools whose calls wait for
approval in it; the team's name and slug, and creating or deleting a team,
are platform staff's (the permission held globally). A member is named by
username: the page lists no user of the deployment to pick from.

Every grant, change and removal of a role is an admin log entry naming the
user, the role and the team (a membership's name says all three), whether
made on the team's page or on the memberships list.
"""

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db import transaction

from console.team_scope import ScopedRelatedFilter
from runs.queue.held_runs import wake_held_runs
from spend.models import TeamBudget
from teams import access
from teams.models import Membership, Team
from tools.registry import get_registry


def known_tools(names, field: str) -> list[str]:
    """``names`` if each is a tool of the deployment, else a
    ValidationError naming the first that is not."""
    registry = get_registry()
    for name in names:
        if name not in registry:
            raise forms.ValidationError(f"{field}: no tool named {name!r} in this deployment")
    return list(names)


class TeamForm(forms.ModelForm):
    """The tools as the deployment's names to tick: ``every_tool`` is the
    team's ``tools`` left empty (every tool, those added later too)."""

    every_tool = forms.BooleanField(
        required=False,
        initial=True,
        label="Every tool",
        help_text="the team may use every tool of the deployment, those added later too; "
        "untick it to allow only the tools ticked below",
    )
    tools = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="the tools the team may use (when not every tool): a run offering another "
        "is refused at enqueue",
    )
    require_approval = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Always wait for approval of",
        help_text="tools whose calls wait for approval in this team although the deployment's "
        "policy does not ask it (a team adds approvals, never removes one)",
    )

    new_webhook_secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        label="Webhook secret",
        help_text="signs this team's run-ended webhooks (G19) in place of the deployment's "
        "NRLLM_RUN_WEBHOOK_SECRET; left empty, the secret stays as it is. Never shown again",
    )
    clear_webhook_secret = forms.BooleanField(
        required=False,
        label="Use the deployment's secret",
        help_text="forget the team's own secret: its webhooks are signed with the deployment's",
    )

    class Meta:
        model = Team
        fields = ["name", "slug", "tools", "require_approval", "max_running"]

    def save(self, commit=True):
        # Write-only: a new secret replaces the old, none keeps it, and the
        # form never renders what is stored.
        if self.cleaned_data.get("clear_webhook_secret"):
            self.instance.webhook_secret = ""
        elif self.cleaned_data.get("new_webhook_secret"):
            self.instance.webhook_secret = self.cleaned_data["new_webhook_secret"]
        return super().save(commit)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        names = get_registry().names()
        stored = [*(self.instance.tools or []), *(self.instance.require_approval or [])]
        # A name the team holds that the deployment no longer has stays
        # shown, to be unticked (saving it is refused, naming it).
        choices = [(name, name) for name in [*names, *sorted(set(stored) - set(names))]]
        for name in ("tools", "require_approval"):
            if name in self.fields:
                self.fields[name].choices = choices
        if self.instance.pk:
            self.initial["every_tool"] = self.instance.tools is None
            self.initial["tools"] = self.instance.tools or []
            self.initial["require_approval"] = self.instance.require_approval or []

    def clean_tools(self):
        return known_tools(self.cleaned_data["tools"], "tools")

    def clean_require_approval(self):
        return known_tools(self.cleaned_data["require_approval"], "require_approval")

    def clean(self):
        cleaned = super().clean()
        if "tools" in cleaned and cleaned.get("every_tool"):
            cleaned["tools"] = None
        return cleaned


class MembershipForm(forms.ModelForm):
    """A member by username (the page lists no user to choose from)."""

    user = forms.ModelChoiceField(
        queryset=get_user_model().objects.filter(is_active=True),
        to_field_name=get_user_model().USERNAME_FIELD,
        widget=forms.TextInput(attrs={"size": 20}),
        error_messages={"invalid_choice": "No active user has that username."},
        help_text="the user's username",
    )

    class Meta:
        model = Membership
        fields = ["user", "team", "role"]


class InTheTeam:
    """An inline of a team's page, decided in that team (G22): its model's
    permissions held in the team shown (``obj``, the team) — or, asked of
    no team (the inline's queryset), in some team; the page asks again of
    its own."""

    def _may(self, request, action: str, team) -> bool:
        opts = self.model._meta
        permission = f"{opts.app_label}.{action}_{opts.model_name}"
        if team is None:
            return access.may_somewhere(request.user, permission)
        return access.may(request.user, permission, team.pk)

    def has_view_permission(self, request, obj=None):
        return self._may(request, "view", obj) or self._may(request, "change", obj)

    def has_add_permission(self, request, obj=None):
        return self._may(request, "add", obj)

    def has_change_permission(self, request, obj=None):
        return self._may(request, "change", obj)

    def has_delete_permission(self, request, obj=None):
        return self._may(request, "delete", obj)


class MembershipInline(InTheTeam, admin.TabularInline):
    """The team's members, a role a row; changed by whoever holds the
    team admin role in the team (or the permission globally)."""

    model = Membership
    form = MembershipForm
    fields = ["user", "role", "created_at"]
    readonly_fields = ["created_at"]
    extra = 1

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("user")


class TeamBudgetInline(InTheTeam, admin.StackedInline):
    """The team's budget (G21): one, shared by every run of the team and
    kept beside each submitter's own. Changed by its team admins."""

    model = TeamBudget
    fields = ["period", "max_tokens", "max_cost", "note"]
    max_num = 1
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    """A team: its name and slug (platform staff's), its tools and the
    approvals it adds, and its members. Seen only by its members (each
    role sees its team), changed by its team admins."""

    form = TeamForm
    inlines = [MembershipInline, TeamBudgetInline]
    list_display = ["slug", "name", "tools_shown", "approvals_shown", "max_running", "created_at"]
    search_fields = ["slug", "name"]
    fields = [
        "name",
        "slug",
        "every_tool",
        "tools",
        "require_approval",
        "max_running",
        "webhook_secret_shown",
        "new_webhook_secret",
        "clear_webhook_secret",
    ]

    def has_add_permission(self, request):
        # A team is the deployment's to create: platform staff only.
        return access.holds_globally(request.user, "teams.add_team")

    def has_delete_permission(self, request, obj=None):
        # Its agents and runs would go with it (they are protected anyway).
        return access.holds_globally(request.user, "teams.delete_team")

    def get_readonly_fields(self, request, obj=None):
        # The cap on runs in flight is the platform's share of the workers
        # among teams: a team admin sees it, never raises it.
        if obj is not None and not access.holds_globally(request.user, "teams.change_team"):
            return ["name", "slug", "max_running", "webhook_secret_shown"]
        return ["webhook_secret_shown"]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change and "max_running" in form.changed_data:
            # A cap raised or lifted: its held runs need not wait for the
            # next run to end, or for the reaper's pass.
            transaction.on_commit(lambda: wake_held_runs(obj.pk))

    @admin.display(description="webhook signing")
    def webhook_secret_shown(self, team: Team) -> str:
        if team.pk and team.webhook_secret:
            return "the team's own secret (set; never shown)"
        return "the deployment's secret (NRLLM_RUN_WEBHOOK_SECRET)"

    @admin.display(description="tools")
    def tools_shown(self, team: Team) -> str:
        return "every tool" if team.tools is None else ", ".join(team.tools) or "none"

    @admin.display(description="always waits for approval")
    def approvals_shown(self, team: Team) -> str:
        return ", ".join(team.require_approval or []) or "-"


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    """Every membership the user may see: one role of one user in one team.
    Added in a team where the user may add members; afterwards only its
    role changes (the user and the team stay)."""

    form = MembershipForm
    list_display = ["user", "team", "role", "created_at"]
    list_filter = [("team", ScopedRelatedFilter), "role"]
    list_select_related = ["user", "team"]
    search_fields = ["user__username", "team__slug"]

    def get_readonly_fields(self, request, obj=None):
        return ["user", "team"] if obj is not None else []

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        if "team" in form.base_fields:
            # Only the teams where the user may add members (G22).
            form.base_fields["team"].queryset = access.scoped(
                Team.objects.all(), request.user, "teams.add_membership"
            )
        return form
