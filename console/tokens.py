"""API tokens in the admin with their narrowing (G22): knox's own token
admin, and under it the token's scope — one team, read-only — as
``manage.py create_api_token --team --read-only`` sets it. A token never
exceeds its user's roles at each request; narrowing it to a team its user
is not a member of (without a global permission) is refused here, as the
command refuses it."""

from django import forms
from django.contrib import admin
from django.contrib.auth.backends import ModelBackend
from knox.admin import AuthTokenAdmin
from knox.models import AuthToken

from teams import access
from teams.models import TokenScope


class TokenScopeFormSet(forms.BaseInlineFormSet):
    def clean(self):
        super().clean()
        user = getattr(self.instance, "user", None)
        for form in self.forms:
            team = (getattr(form, "cleaned_data", None) or {}).get("team")
            if team is None or user is None or form.cleaned_data.get("DELETE"):
                continue
            if team.pk in access.roles_by_team(user):
                continue
            if user.is_superuser or ModelBackend().get_all_permissions(user):
                continue
            form.add_error(
                "team",
                f"{user.get_username()} is not a member of team {team.slug} and holds no "
                "global permission: a token cannot reach a team its user cannot",
            )


class TokenScopeInline(admin.StackedInline):
    model = TokenScope
    formset = TokenScopeFormSet
    max_num = 1
    extra = 1
    verbose_name = "narrowing"
    verbose_name_plural = "narrowing (empty: every team of the user, not read-only)"


class ScopedAuthTokenAdmin(AuthTokenAdmin):
    inlines = [TokenScopeInline]
    list_display = (*AuthTokenAdmin.list_display, "scope")
    list_select_related = ("user", "scope__team")

    @admin.display(description="narrowed to")
    def scope(self, token: AuthToken) -> str:
        scope = getattr(token, "scope", None)
        return "—" if scope is None else str(scope)


if admin.site.is_registered(AuthToken):
    admin.site.unregister(AuthToken)
admin.site.register(AuthToken, ScopedAuthTokenAdmin)
