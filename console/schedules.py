"""Schedules in the console (G23): the list — each with its timing, its
state and its next firing —, the form, and a schedule's page: why it is
paused and the run that paused it, its next firings in its own time zone
and in UTC, its last firings with their runs, and the buttons to pause,
resume and backfill it.

Pausing and resuming take ``triggers.pause_schedule`` in the schedule's
team (the operator role) and go through ``triggers.actions``, which
writes the admin log; a resume refused (a run of it still has an open
question) says why. A backfill is its own page (``console.backfill_page``).
Firings are shown on their schedule's page only: no list of their own."""

from zoneinfo import available_timezones

from django import forms
from django.contrib import admin, messages
from django.shortcuts import get_object_or_404, redirect
from django.urls import path, reverse
from django.utils.html import format_html

from console.backfill_page import START_RUNS, backfill_page
from console.display import cut, short_id
from console.team_scope import ScopedRelatedFilter, require
from console.trigger_forms import AgentOwnedAdmin, AgentOwnedForm, both_clocks
from runs.models import AgentRun
from teams import access
from triggers import actions
from triggers.models import Schedule, SkipReason

PAUSE = "triggers.pause_schedule"
VIEW_RUNS = "runs.view_agentrun"
#: A pause reason in a list's row (whole on the schedule's page).
REASON_CHARS = 120
RECENT_FIRINGS = 10
NEXT_FIRINGS = 5


class ScheduleForm(AgentOwnedForm):
    add_permission = "triggers.add_schedule"

    class Meta:
        model = Schedule
        fields = [
            "name",
            "agent",
            "version",
            "cron",
            "interval_seconds",
            "time_zone",
            "overlap",
            "catchup_window_seconds",
            "input_template",
        ]
        widgets = {
            "cron": forms.TextInput(attrs={"size": 30, "placeholder": "0 7 * * 1-5"}),
            "time_zone": forms.TextInput(attrs={"list": "time-zones", "size": 30}),
            "input_template": forms.Textarea(attrs={"rows": 4, "cols": 80}),
        }
        help_texts = {
            "name": "unique among the agent's schedules (letters, digits, - and _)",
            "cron": "five fields (minute hour day month weekday), read in the time zone below; "
            "or leave it blank and give an interval",
            "interval_seconds": "every so many seconds, counted from 1970-01-01 00:00 UTC "
            "(3600: on the hour); blank with a cron expression",
            "time_zone": "the IANA time zone the cron expression is read in (Europe/Berlin)",
            "overlap": "what a slot does while the schedule's last run is still in flight",
            "catchup_window_seconds": "after downtime, a missed slot less than this old is "
            "fired; an older one is recorded as missed, not fired",
            "input_template": "the run's input; ${scheduled_time}, ${scheduled_date} and "
            "${schedule} are replaced (the slot, in the schedule's time zone)",
        }


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("active", "Active"), ("paused", "Paused")]

    def queryset(self, request, queryset):
        if self.value() == "active":
            return queryset.filter(paused_at__isnull=True)
        if self.value() == "paused":
            return queryset.filter(paused_at__isnull=False)
        return queryset


@admin.register(Schedule)
class ScheduleAdmin(AgentOwnedAdmin, admin.ModelAdmin):
    form = ScheduleForm
    list_display = [
        "name",
        "agent",
        "timing",
        "overlap_shown",
        "owner",
        "state_shown",
        "next_firing",
    ]
    list_filter = [StateFilter, ("agent", ScopedRelatedFilter), "overlap"]
    list_select_related = ["agent", "owner"]
    search_fields = ["name", "agent__name"]
    actions = ["pause_selected", "resume_selected"]
    fieldsets = [
        (None, {"fields": ["name", "agent", "version", "owner_shown"]}),
        (
            "When",
            {
                "fields": [
                    "cron",
                    "interval_seconds",
                    "time_zone",
                    "overlap",
                    "catchup_window_seconds",
                ]
            },
        ),
        ("What", {"fields": ["input_template"]}),
    ]

    def save_model(self, request, obj, form, change):
        # Schedule.save writes the definition only, never the pause or
        # ``active_since`` as this page read them (a pause the scheduler or
        # an operator committed meanwhile stays); the owner is whoever saves.
        obj.save()

    def has_pause_permission(self, request, obj=None) -> bool:
        if obj is None:
            return access.may_somewhere(request.user, PAUSE)
        return access.may(request.user, PAUSE, access.team_id_of(obj))

    # --- columns ------------------------------------------------------------------

    @admin.display(description="overlap", ordering="overlap")
    def overlap_shown(self, schedule: Schedule) -> str:
        return schedule.overlap.replace("_", " ")

    @admin.display(description="state", ordering="paused_at")
    def state_shown(self, schedule: Schedule) -> str:
        if schedule.paused_at is None:
            return "active"
        return format_html(
            '<strong class="schedule-paused">paused</strong>: <span title="{}">{}</span>',
            schedule.pause_reason,
            cut(schedule.pause_reason, REASON_CHARS) or "no reason given",
        )

    @admin.display(description="next firing")
    def next_firing(self, schedule: Schedule) -> str:
        upcoming = actions.next_firing_times(schedule, 1)
        if not upcoming:
            return "—"
        clocks = both_clocks(upcoming[0], schedule.time_zone)
        return format_html('<span title="{}">{}</span>', clocks["utc"], clocks["local"])

    # --- the schedule's page ---------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        schedule = self.get_object(request, object_id)
        if schedule is not None:
            extra_context = {
                **schedule_page_context(self, request, schedule),
                **(extra_context or {}),
            }
        return super().change_view(request, object_id, form_url, extra_context)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        context["time_zones"] = sorted(available_timezones())
        return super().render_change_form(request, context, add, change, form_url, obj)

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path(
                "<int:schedule_id>/backfill/",
                view(self.backfill_view),
                name="triggers_schedule_backfill",
            ),
            *[
                path(
                    f"<int:schedule_id>/{action}/",
                    view(self.pause_or_resume_view),
                    {"action": action},
                    name=f"triggers_schedule_{action}",
                )
                for action in ("pause", "resume")
            ],
            *super().get_urls(),
        ]

    def backfill_view(self, request, schedule_id):
        return backfill_page(self, request, schedule_id)

    def pause_or_resume_view(self, request, schedule_id, action):
        """POST only (the page's buttons): another team's schedule is not
        found; one seen but not the user's to pause is a 403 naming the role."""
        schedule = get_object_or_404(self.get_queryset(request), pk=schedule_id)
        back = reverse("admin:triggers_schedule_change", args=[schedule.pk])
        if request.method != "POST":
            return redirect(back)
        doing = "Pausing a schedule" if action == "pause" else "Resuming a schedule"
        require(request.user, PAUSE, schedule, doing)
        change = actions.pause if action == "pause" else actions.resume
        result = change(schedule, request.user, request.POST.get("note", "").strip())
        self.message_user(request, _sentence(result.detail), _level(result))
        return redirect(back)

    # --- actions ----------------------------------------------------------------------

    @admin.action(description="Pause selected schedules", permissions=["pause"])
    def pause_selected(self, request, queryset):
        self._pause_or_resume(request, queryset, actions.pause)

    @admin.action(description="Resume selected schedules", permissions=["pause"])
    def resume_selected(self, request, queryset):
        self._pause_or_resume(request, queryset, actions.resume)

    def _pause_or_resume(self, request, queryset, change):
        # Only the schedules of the teams where the user may pause (G22);
        # the selection was already only what it sees.
        acting = access.scoped(queryset, request.user, PAUSE).select_related("agent")
        done, refused = [], []
        for schedule in acting:
            result = change(schedule, request.user)
            (done if result.ok else refused).append(result)
        if done:
            words = "; ".join(result.detail for result in done)
            self.message_user(request, _sentence(words), messages.SUCCESS)
        for result in refused:
            self.message_user(request, _sentence(result.detail), _level(result))
        left_out = queryset.count() - len(done) - len(refused)
        if left_out:
            self.message_user(
                request,
                f"{left_out} schedule(s) left as they were: pausing and resuming take "
                "the operator role in the schedule's team.",
                messages.ERROR,
            )


def _level(result) -> int:
    """Done; as it was already (paused twice); or refused (an open question)."""
    if result.ok:
        return messages.SUCCESS
    return messages.WARNING if result.code in ("already_paused", "not_paused") else messages.ERROR


def _sentence(text: str) -> str:
    text = text[:1].upper() + text[1:]
    return text if text.endswith(".") else f"{text}."


def schedule_page_context(model_admin, request, schedule: Schedule) -> dict:
    """What ``templates/admin/triggers/schedule/change_form.html`` shows
    above the form: the state, the buttons ``request.user`` may use, the
    next firings and the last ones."""
    visible_runs = access.scoped(AgentRun.objects, request.user, VIEW_RUNS)
    paused_for = None
    if schedule.paused_for_run_id is not None:
        # Retention may have deleted the run: no constraint keeps it.
        paused_for = {
            "id": schedule.paused_for_run_id,
            "short": short_id(schedule.paused_for_run_id),
            "run": visible_runs.filter(pk=schedule.paused_for_run_id).only("status").first(),
        }
    team_id = access.team_id_of(schedule)
    return {
        "schedule": schedule,
        "paused_for": paused_for,
        "can_pause": model_admin.has_pause_permission(request, schedule),
        "can_backfill": access.may(request.user, START_RUNS, team_id),
        "next_firings": [
            both_clocks(slot, schedule.time_zone)
            for slot in actions.next_firing_times(schedule, NEXT_FIRINGS)
        ],
        "recent_firings": [
            {
                "firing": firing,
                "slot": both_clocks(firing.slot, schedule.time_zone),
                "reason": dict(SkipReason.choices).get(firing.reason, firing.reason),
                "run": firing.run if firing.run_id else None,
                "short": short_id(firing.run_id) if firing.run_id else "",
            }
            for firing in actions.recent_firings(schedule, RECENT_FIRINGS)
        ],
    }
