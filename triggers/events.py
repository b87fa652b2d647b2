"""Receiving a signed event (G23): at most one run per sender's event id.

In order, each refusal storing nothing:

1. the trigger is found by its URL's path (else 404) and the body is at
   most ``MAX_BODY_BYTES`` (else 413);
2. the signature and, for Standard Webhooks, the timestamp are checked
   (``triggers.signatures``): else 401, saying only that it was refused;
3. a disabled trigger answers 409; a body that is no JSON object, an event
   id that cannot be read, or an input template naming a field the body
   lacks answers 400 naming it;
4. an event id accepted within the trigger's window answers 200 with the
   run it started — a sender retrying, or Alertmanager re-sending a group,
   never starts a second run;
5. past ``max_events_per_minute`` accepted in the last minute, 429;
6. the event row and the run are inserted in one transaction, the row's
   unique (trigger, event id) deciding between two deliveries racing: the
   loser answers 200 with the winner's run. A start refused (the owner's
   budget spent, the owner no longer a runner, the agent's version refused)
   rolls the row back and answers as the API would (429 with ``Retry-After``, 403, 400), so the
   sender's retry may start it later.

Its run is the trigger owner's (budget, four-eyes), started as
``submitted_via=trigger``; the event row names the run, and the run's
page names the trigger and the event id.
"""

import json
import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from agents.starting import StartForbidden
from agents.starting import enqueue as start_run
from runs.models.vocabulary import SubmittedVia
from runs.runtime.enqueue_spend import BudgetRefused
from runs.runtime.run_request import InvalidRunRequest
from tools.canonical import storable_text
from triggers import metrics
from triggers.models import EventTrigger, TriggerEvent, refuse_a_submitter_who_may_not_start
from triggers.signatures import Unauthenticated, verify
from triggers.templates import TemplateError, render

logger = logging.getLogger(__name__)

#: The largest body a trigger reads.
MAX_BODY_BYTES = 256 * 1024
MAX_EVENT_ID_CHARS = 500


@dataclass
class Answer:
    status: int
    body: dict
    headers: dict = field(default_factory=dict)


def _refused(status: int, outcome: str, detail: str, **headers) -> Answer:
    metrics.event(outcome)
    return Answer(status, {"detail": detail}, headers)


def receive(path: str, headers, body: bytes) -> Answer:
    """What the sender of ``body`` to ``/api/hooks/<path>/`` is answered
    (see the module). ``headers``: case-insensitive, as Django's are."""
    trigger = (
        EventTrigger.objects.select_related("agent", "agent__team", "version", "owner")
        .filter(path=path)
        .first()
    )
    if trigger is None:
        return _refused(404, "not_found", "no trigger at this address")
    if len(body) > MAX_BODY_BYTES:
        return _refused(413, "invalid", f"the body is larger than {MAX_BODY_BYTES} bytes")
    try:
        verify(trigger, headers, body)
    except Unauthenticated as why:
        logger.warning("trigger=%s event refused: %s", trigger.pk, why)
        return _refused(401, "unauthenticated", "the signature is missing, wrong or stale")
    if not trigger.enabled:
        return _refused(409, "disabled", f"trigger {trigger.name} is disabled")
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, ValueError) as error:
        return _refused(400, "invalid", f"body: no JSON ({error})")
    except RecursionError:
        # ``[[[[…]]]]`` a few hundred KB deep: not a ValueError (api.parsers).
        return _refused(400, "invalid", "body: JSON nested too deeply")
    if not isinstance(payload, dict):
        return _refused(400, "invalid", "body: a JSON object is expected")
    try:
        event_id = _event_id(trigger, headers, payload)
        prompt = render(trigger.input_template, payload, what="body")
    except TemplateError as error:
        return _refused(400, "invalid", str(error))
    if not prompt:
        return _refused(400, "invalid", "input: the template makes an empty input")

    window_opens = timezone.now() - timedelta(seconds=trigger.dedup_window_seconds)
    seen = _seen(trigger, event_id, window_opens)
    if seen is not None:
        return seen
    minute_ago = timezone.now() - timedelta(seconds=60)
    if trigger.events.filter(received_at__gte=minute_ago).count() >= trigger.max_events_per_minute:
        return _refused(
            429,
            "rate_limited",
            f"trigger {trigger.name} takes {trigger.max_events_per_minute} events a minute",
            **{"Retry-After": "60"},
        )
    start = {"agent": trigger.agent.name, "input": prompt}
    if trigger.version_id is not None:
        start["version"] = trigger.version.number
    try:
        refuse_a_submitter_who_may_not_start(trigger.owner, trigger.agent)
        with transaction.atomic():
            # An id older than the window belongs to the new event now.
            trigger.events.filter(
                event_id=event_id, expired=False, received_at__lt=window_opens
            ).update(expired=True)
            event = TriggerEvent.objects.create(trigger=trigger, event_id=event_id)
            run = start_run(start, submitted_by=trigger.owner, submitted_via=SubmittedVia.TRIGGER)
            TriggerEvent.objects.filter(pk=event.pk).update(run=run)
    except IntegrityError:
        # The unique (trigger, event id): the same event, delivered at the
        # same moment, was accepted first.
        return _seen(trigger, event_id, window_opens) or _refused(
            409, "duplicate", "the same event is being accepted: send it again"
        )
    except InvalidRunRequest as error:
        return _refused(400, "refused", str(error))
    except StartForbidden as error:
        return _refused(403, "refused", f"the trigger's owner: {error}")
    except BudgetRefused as error:
        return _refused(
            429,
            "refused",
            str(error),
            **{"Retry-After": str(error.retry_after_seconds or 60)},
        )
    metrics.event("started")
    logger.info("trigger=%s event=%r run=%s started", trigger.pk, event_id, run.pk)
    return Answer(202, {"run": str(run.pk), "event_id": event_id, "duplicate": False})


def _event_id(trigger: EventTrigger, headers, payload: dict) -> str:
    if trigger.event_id_template:
        event_id = render(trigger.event_id_template, payload, what="body")
    else:
        event_id = headers.get(trigger.event_id_header, "")
        if not event_id:
            raise TemplateError(
                f"{trigger.event_id_header}: the header carrying the event id is missing"
            )
    if not event_id:
        raise TemplateError("event id: it is empty (every such event would be one)")
    if len(event_id) > MAX_EVENT_ID_CHARS or storable_text(event_id) != event_id:
        raise TemplateError(
            f"event id: at most {MAX_EVENT_ID_CHARS} characters, no NUL, no lone surrogate"
        )
    return event_id


def _seen(trigger: EventTrigger, event_id: str, window_opens) -> Answer | None:
    """The answer to an event already accepted within the window."""
    event = (
        trigger.events.filter(event_id=event_id, expired=False, received_at__gte=window_opens)
        .only("run_id")
        .first()
    )
    if event is None:
        return None
    metrics.event("duplicate")
    return Answer(
        200,
        {
            "run": str(event.run_id) if event.run_id else None,
            "event_id": event_id,
            "duplicate": True,
        },
    )
