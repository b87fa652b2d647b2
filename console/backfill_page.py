"""A schedule's backfill page (G23): a range, then what firing it would
do — how many runs it starts, the slots a row already records (left
alone), the agent's tools that write and those that wait for approval —,
then, confirmed, the runs. A thin adapter over ``triggers.actions``
(``backfill_preview``, ``backfill``), as the API's view is.

A time written without its offset is read on the schedule's clock (its
time zone), as its cron expression is. The runs are the backfiller's:
it takes the runner role in the agent's team; a bad range is refused
beside the field it names, and nothing is started."""

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from console.team_scope import require
from console.trigger_forms import both_clocks
from tools.registry import effect_for
from triggers import actions
from triggers.actions import BACKFILL_MAX_SLOTS, BackfillRefused
from triggers.models import Schedule

START_RUNS = "runs.add_agentrun"
#: Slots the preview names one by one (it counts them all).
SLOTS_SHOWN = 20


class MomentField(forms.Field):
    """A moment: ``2026-12-01 07:00`` on ``time_zone``'s clock, or with its
    offset (``2026-12-01T07:00:00Z``, ``…+01:00``)."""

    widget = forms.TextInput

    def __init__(self, *, time_zone: str = "UTC", **kwargs):
        self.time_zone = time_zone
        super().__init__(**kwargs)

    def to_python(self, value):
        text = str(value or "").strip()
        if not text:
            return None
        try:
            moment = datetime.fromisoformat(text[:64])
        except ValueError:
            raise forms.ValidationError(
                f"{text[:64]!r} is no time: write 2026-12-01 07:00 (in {self.time_zone}), "
                "or give its offset (2026-12-01T07:00:00Z)"
            ) from None
        if moment.tzinfo is None:
            # A time the clock shows twice (clocks going back): its first.
            moment = moment.replace(tzinfo=ZoneInfo(self.time_zone))
        return moment


class BackfillForm(forms.Form):
    start = MomentField(help_text="slots after it are fired")
    end = MomentField(help_text="slots up to it, itself included; a past time")

    def __init__(self, schedule: Schedule, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.time_zone = schedule.time_zone
            field.widget.attrs.update({"size": 28, "placeholder": "2026-12-01 07:00"})
            field.help_text += f" — in {schedule.time_zone} unless it gives its offset"


def _initial(schedule: Schedule) -> dict:
    """The last day, to the minute, on the schedule's clock."""
    now = timezone.now().astimezone(ZoneInfo(schedule.time_zone)).replace(second=0, microsecond=0)
    return {
        "start": (now - timedelta(days=1)).strftime("%Y-%m-%d %H:%M"),
        "end": now.strftime("%Y-%m-%d %H:%M"),
    }


def _refused_beside(form: BackfillForm, refusal: Exception) -> None:
    """A refusal (``end: …``) beside the field it names."""
    field, _, words = str(refusal).partition(": ")
    if field in form.fields:
        form.add_error(field, words)
    else:
        form.add_error(None, str(refusal))


def backfill_page(model_admin, request, schedule_id):
    # Another team's schedule is not found; one seen but not the user's
    # to backfill is a 403 naming the role, in its team (G22).
    schedule = get_object_or_404(
        model_admin.get_queryset(request).select_related("agent__team", "agent__latest", "version"),
        pk=schedule_id,
    )
    require(request.user, START_RUNS, schedule, "Backfilling a schedule (it starts runs)")
    form = BackfillForm(schedule, request.POST or None, initial=_initial(schedule))
    preview = None
    if request.method == "POST" and form.is_valid():
        start, end = form.cleaned_data["start"], form.cleaned_data["end"]
        try:
            preview = actions.backfill_preview(schedule, start, end)
        except BackfillRefused as refused:
            _refused_beside(form, refused)
        else:
            if preview.too_many:
                form.add_error(
                    "end",
                    f"the range holds more than {BACKFILL_MAX_SLOTS} slots: backfill a shorter one",
                )
                preview = None
            elif request.POST.get("confirm") == "yes":
                done = _backfill(model_admin, request, schedule, form, start, end)
                if done is not None:
                    return done
                preview = None
    return TemplateResponse(
        request,
        "admin/triggers/schedule/backfill.html",
        {
            **model_admin.admin_site.each_context(request),
            "title": f"Backfill {schedule}",
            "opts": model_admin.model._meta,
            "schedule": schedule,
            "form": form,
            "preview": preview and _shown(schedule, preview, form.cleaned_data),
        },
    )


def _backfill(model_admin, request, schedule, form, start, end):
    """Fire the range: the redirect to the schedule, or None with the
    refusal on the form (nothing started)."""
    try:
        result = actions.backfill(schedule, start, end, request.user)
    except BackfillRefused as refused:  # the clock moved past a check
        _refused_beside(form, refused)
        return None
    if result.code == "too_many":
        form.add_error("end", result.detail)
        return None
    level = messages.SUCCESS if result.ok else messages.ERROR
    model_admin.message_user(request, f"Backfill of {schedule}: {result.detail}.", level)
    return redirect(reverse("admin:triggers_schedule_change", args=[schedule.pk]))


def _shown(schedule: Schedule, preview, cleaned: dict) -> dict:
    already = set(preview.already)
    firing = [slot for slot in preview.slots if slot not in already]
    asked = set(preview.approval_required)
    return {
        "runs": preview.runs,
        "slots": len(preview.slots),
        "firing": [both_clocks(slot, schedule.time_zone) for slot in firing[:SLOTS_SHOWN]],
        "firing_more": max(len(firing) - SLOTS_SHOWN, 0),
        "already": [
            both_clocks(slot, schedule.time_zone) for slot in preview.already[:SLOTS_SHOWN]
        ],
        "already_count": len(preview.already),
        "already_more": max(len(preview.already) - SLOTS_SHOWN, 0),
        "writes": [
            {"name": name, "effect": effect_for(name), "waits": name in asked}
            for name in preview.writes
        ],
        "waiting": len(asked),
        # The range the confirmation fires: as read, with its offset.
        "start": cleaned["start"].isoformat(),
        "end": cleaned["end"].isoformat(),
        "start_shown": both_clocks(cleaned["start"], schedule.time_zone),
        "end_shown": both_clocks(cleaned["end"], schedule.time_zone),
    }
