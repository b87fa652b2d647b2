"""One attempt of a run-ended webhook (G19): the body, its signature, the
POST through the SSRF guard, and what the answer makes of the event.

The body is what the event recorded when the run's status changed (its
status, reason, output, tokens, cost), so every attempt of one event sends
the same run data; ``sent_at`` and ``attempt`` say which attempt it is. It
is signed with the run's team's secret, or else the deployment's.
The POST goes as the approval webhook's does (``runs.approvals.webhook``:
the guard's checked, pinned connection, ``NRLLM_RUN_WEBHOOK_TIMEOUT_SECONDS``
for the whole exchange, no redirect followed, a bounded answer), except
that the host must be one ``NRLLM_HTTP_ALLOWED_HOSTS`` allows: the run's
submitter chose the URL, not an operator.

A 2xx answer delivers the event; anything else — another status, no
answer, a URL the guard refuses now — is a failed attempt, recorded with
its reason and tried again after the backoff, until the last attempt gives
it up. What is recorded or logged of an answer or an error is
``webhook_url.scrubbed`` of the URL: no part of its path or query, which
often hold the receiver's token, even where the receiver echoes one back.
The POST holds no database connection (``post``). Never raises for the
receiver's doing.
"""

import json
import logging
from datetime import datetime

import httpx
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from runs.approvals.webhook import SIGNATURE_HEADER, post, signature
from runs.approvals.webhook_url import scrubbed, scrubbed_traceback
from runs.models.metrics import RUN_WEBHOOKS
from runs.models.run_events import RunEvent
from runs.run_webhooks import outbox
from spend.usage import money_text
from tools.contract import ToolError

logger = logging.getLogger(__name__)

EVENT_ID_HEADER = "X-Nrllm-Event-Id"
EVENT_HEADER = "X-Nrllm-Event"
#: Of a refusing answer or an error, what ``last_error`` keeps.
ERROR_CHARS = 300

DELIVERED, REJECTED, FAILED, GAVE_UP = "delivered", "rejected", "failed", "gave_up"


def attempt(event: RunEvent, *, as_of: datetime | None = None) -> str:
    """POST the claimed ``event`` once and record the outcome: ``delivered``,
    ``rejected`` (an answer that is not 2xx) or ``failed`` (refused by the
    guard, or no complete answer)."""
    url = event.url
    try:
        body = body_of(event)
        status, answer = post(
            url,
            body,
            headers_of(event, body),
            seconds=settings.NRLLM_RUN_WEBHOOK_TIMEOUT_SECONDS,
            host_allowed=False,
        )
    except (ToolError, httpx.HTTPError) as error:
        return _failed(event, None, scrubbed(f"{_kind(error)}{error}", url), as_of)
    except Exception as error:
        # Whatever it is, it is this attempt's failure: the next one may do.
        logger.error(
            "run=%s event=%s webhook attempt failed: %s",
            event.run_id,
            event.pk,
            scrubbed_traceback(url),
        )
        return _failed(event, None, f"{type(error).__name__} (see the log)", as_of)
    if 200 <= status < 300:
        outbox.delivered(event, status, as_of=as_of)
        RUN_WEBHOOKS.labels(DELIVERED).inc()
        logger.info(
            "run=%s %s event=%s delivered (%d) at attempt %d",
            event.run_id,
            event.event_type,
            event.pk,
            status,
            event.attempts,
        )
        return DELIVERED
    return _failed(event, status, scrubbed(f"answered {status}: {answer}", url), as_of)


def body_of(event: RunEvent) -> bytes:
    """The JSON body of ``event`` (its ``run`` and agent version loaded)."""
    run = event.run
    version = run.agent_version
    document = {
        "event_id": str(event.pk),
        "event": event.event_type,
        "occurred_at": event.occurred_at.isoformat(),
        "sent_at": timezone.now().isoformat(),
        "attempt": event.attempts,
        "run": {
            "id": str(event.run_id),
            # Inside the signed body: an event of one team's run cannot be
            # passed off at another team's receiver as its own (G19, G22).
            "team": run.team.slug,
            "status": event.status,
            "termination_reason": event.termination_reason,
            "failure_class": event.failure_class,
            "dead_lettered": event.dead_lettered,
            "output": event.output,
            "tokens": {
                "prompt": event.prompt_tokens,
                "completion": event.completion_tokens,
                "cached": event.cached_prompt_tokens,
                "total": event.prompt_tokens + event.completion_tokens,
            },
            # Unknown while a turn had no price: null, never 0 (G17).
            "cost": None if event.unpriced_turns else money_text(event.cost),
            "currency": settings.NRLLM_CURRENCY,
            "agent": None
            if version is None
            else {"name": version.agent.name, "version": version.number},
            "admin_path": reverse("admin:runs_agentrun_change", args=[event.run_id]),
        },
    }
    return json.dumps(document, separators=(",", ":")).encode()


def headers_of(event: RunEvent, body: bytes) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "nrllm-ops run webhook",
        EVENT_HEADER: event.event_type,
        EVENT_ID_HEADER: str(event.pk),
    }
    secret = secret_of(event)
    if secret:
        headers[SIGNATURE_HEADER] = signature(body, secret)
    return headers


def secret_of(event: RunEvent) -> str:
    """What ``event`` is signed with: its run's team's secret, so a receiver
    of one team's events cannot be sent another team's as its own (G19);
    else the deployment's ``NRLLM_RUN_WEBHOOK_SECRET`` ("" : unsigned)."""
    return event.run.team.webhook_secret or settings.NRLLM_RUN_WEBHOOK_SECRET


def _failed(event: RunEvent, status: int | None, error: str, as_of) -> str:
    """Record and log a failed attempt; ``error`` is scrubbed already (cut
    here, after it: a token cut in two would not be found)."""
    outcome = FAILED if status is None else REJECTED
    RUN_WEBHOOKS.labels(outcome).inc()
    error = error[:ERROR_CHARS]
    gave_up = outbox.failed(event, status, error, as_of=as_of)
    if gave_up:
        RUN_WEBHOOKS.labels(GAVE_UP).inc()
        logger.error(
            "run=%s %s event=%s given up after %d attempts: %s",
            event.run_id,
            event.event_type,
            event.pk,
            event.attempts,
            error,
        )
    else:
        logger.warning(
            "run=%s %s event=%s attempt %d not delivered: %s",
            event.run_id,
            event.event_type,
            event.pk,
            event.attempts,
            error,
        )
    return outcome


def _kind(error: Exception) -> str:
    """The prefix naming an HTTP failure (``ConnectError: ``): its text may be empty."""
    return "" if isinstance(error, ToolError) else f"{type(error).__name__}: "
