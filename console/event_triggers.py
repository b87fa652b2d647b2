"""Event triggers in the console (G23): the list, the form, and a
trigger's page — where its sender posts (the URL, the signature scheme
and its headers), its secret for whoever may change the trigger, and its
last events with their runs. Events are shown on their trigger's page
only: no list of their own.

The secret is made by the model when the trigger is created and is never
a field of the form: it is shown, not typed (a sender is given it)."""

from datetime import timedelta

from django import forms
from django.contrib import admin
from django.db.models import Max

from console.display import moment, short_id, span
from console.team_scope import ScopedRelatedFilter
from console.trigger_forms import AgentOwnedAdmin, AgentOwnedForm
from triggers import actions
from triggers.models import EventTrigger, SignatureScheme
from triggers.signatures import TOLERANCE_SECONDS

RECENT_EVENTS = 20


class EventTriggerForm(AgentOwnedForm):
    add_permission = "triggers.add_eventtrigger"

    class Meta:
        model = EventTrigger
        fields = [
            "name",
            "agent",
            "version",
            "enabled",
            "scheme",
            "event_id_header",
            "event_id_template",
            "dedup_window_seconds",
            "max_events_per_minute",
            "input_template",
        ]
        widgets = {
            "event_id_template": forms.TextInput(
                attrs={"size": 50, "placeholder": "${groupKey}/${alerts.0.startsAt}"}
            ),
            "input_template": forms.Textarea(attrs={"rows": 4, "cols": 80}),
        }
        help_texts = {
            "name": "unique among the agent's triggers (letters, digits, - and _)",
            "enabled": "a disabled trigger answers its sender 409 and starts nothing",
            "scheme": "how the sender signs each event with the trigger's secret",
            "event_id_header": "the header that carries the sender's event id "
            "(webhook-id; X-GitHub-Delivery for GitHub)",
            "event_id_template": "or the event id made of the body's fields; "
            "when given, the header is not read",
            "dedup_window_seconds": "an event id seen again within it is the same event: "
            "its run is answered, none is started",
            "max_events_per_minute": "events accepted a minute at most; past it the sender "
            "is answered 429",
            "input_template": "the run's input: ${field} and ${nested.0.field} are the "
            "body's; a field the body lacks refuses the event (400, naming it)",
        }


@admin.register(EventTrigger)
class EventTriggerAdmin(AgentOwnedAdmin, admin.ModelAdmin):
    form = EventTriggerForm
    list_display = ["name", "agent", "scheme_shown", "enabled", "owner", "last_event"]
    list_filter = ["enabled", ("agent", ScopedRelatedFilter), "scheme"]
    list_select_related = ["agent", "owner"]
    search_fields = ["name", "agent__name"]
    fieldsets = [
        (None, {"fields": ["name", "agent", "version", "owner_shown", "enabled"]}),
        (
            "The sender's events",
            {
                "fields": [
                    "scheme",
                    "event_id_header",
                    "event_id_template",
                    "dedup_window_seconds",
                    "max_events_per_minute",
                ]
            },
        ),
        ("What", {"fields": ["input_template"]}),
    ]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(last_event_at=Max("events__received_at"))

    @admin.display(description="signature")
    def scheme_shown(self, trigger: EventTrigger) -> str:
        return "GitHub" if trigger.scheme == SignatureScheme.GITHUB else "Standard Webhooks"

    @admin.display(description="last event", ordering="last_event_at")
    def last_event(self, trigger: EventTrigger) -> str:
        return moment(trigger.last_event_at) or "none yet"

    def change_view(self, request, object_id, form_url="", extra_context=None):
        trigger = self.get_object(request, object_id)
        if trigger is not None:
            extra_context = {
                **trigger_page_context(self, request, trigger),
                **(extra_context or {}),
            }
        return super().change_view(request, object_id, form_url, extra_context)


def trigger_page_context(model_admin, request, trigger: EventTrigger) -> dict:
    """What ``templates/admin/triggers/eventtrigger/change_form.html``
    shows above the form: where events go and how they are signed (the
    secret only to who may change the trigger), and its last events."""
    events = actions.recent_events(trigger, RECENT_EVENTS)
    return {
        "trigger": trigger,
        "hook_url": request.build_absolute_uri(f"/api/hooks/{trigger.path}/"),
        "github": trigger.scheme == SignatureScheme.GITHUB,
        "tolerance_minutes": TOLERANCE_SECONDS // 60,
        "dedup_window": span(timedelta(seconds=trigger.dedup_window_seconds)),
        # The owner's only: events signed with it start runs that are theirs.
        "may_see_secret": request.user.pk == trigger.owner_id,
        "recent_events": [
            {
                "event": event,
                "received": moment(event.received_at),
                "run": event.run if event.run_id else None,
                "short": short_id(event.run_id) if event.run_id else "",
            }
            for event in events
        ],
    }
