"""The approval webhook (G14): ``NRLLM_APPROVAL_WEBHOOK_URL`` hears when a
run starts to wait, so an integration need not poll every run.

One POST per park, made by the attempt that parked, after the park
committed. It goes through the tools' SSRF guard (``http_guard``: resolved
once, every address checked, a non-public one refused unless
``NRLLM_HTTP_ALLOWED_HOSTS`` allows it literally) and their pinned
transport, ends by ``NRLLM_APPROVAL_WEBHOOK_TIMEOUT_SECONDS``, follows no
redirect and reads a bounded answer.

At most once and best effort: a failure is logged and counted, never
retried, and never changes the run; a worker killed between the park and
the POST sends none. ``GET /api/approvals/?status=pending`` is the reliable
way to learn what waits. What is logged of an answer or an error is
``webhook_url.scrubbed`` of the URL (a receiver may echo its token), and
the POST (``post``, the run-ended webhook's too) holds no database
connection while the receiver answers.

With ``NRLLM_APPROVAL_WEBHOOK_SECRET`` set, ``X-Nrllm-Signature-256`` carries
``sha256=`` and the hex HMAC-SHA256 of the body's exact bytes under it, so
a receiver can tell our POSTs from anyone else's (an agent's
``post_webhook`` call included); the body's ``sent_at`` lets it refuse old
ones.
"""

import hashlib
import hmac
import json
import logging

import httpx
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from ground.database import release_connection
from runs.approvals.webhook_url import scrubbed, scrubbed_traceback
from runs.models import AgentRun
from runs.models.metrics import APPROVAL_WEBHOOKS
from tools.builtin.http_guard import check_url
from tools.builtin.http_transport import Deadline, PinnedTransport, read_capped
from tools.contract import ToolError

logger = logging.getLogger(__name__)

EVENT = "approval_requested"
SIGNATURE_HEADER = "X-Nrllm-Signature-256"
#: The prompt is sent shortened: enough to recognise the run, not its data.
PROMPT_CHARS = 200
#: Of a refusing answer's body, what the log shows.
LOGGED_BODY_CHARS = 200


def notify(run_id, approvals: list) -> None:
    """POST the ``approval_requested`` event for the run ``run_id``, parked
    with ``approvals``. Never raises: what went wrong is logged."""
    url = settings.NRLLM_APPROVAL_WEBHOOK_URL
    try:
        body = json.dumps(event(run_id, approvals), separators=(",", ":")).encode()
        status, answer = post(
            url,
            body,
            _headers(body),
            seconds=settings.NRLLM_APPROVAL_WEBHOOK_TIMEOUT_SECONDS,
            host_allowed=True,
        )
    except (ToolError, httpx.HTTPError) as error:
        APPROVAL_WEBHOOKS.labels("failed").inc()
        # The guard's refusal quotes the URL, whose path or query is often
        # the receiver's credential (a hook token): the log shows its origin.
        shown = scrubbed(str(error), url)
        logger.warning("run=%s approval webhook not delivered: %s", run_id, shown)
        return
    except Exception:
        # Whatever it is, the run is parked already and must stay so.
        APPROVAL_WEBHOOKS.labels("failed").inc()
        logger.error("run=%s approval webhook failed: %s", run_id, scrubbed_traceback(url))
        return
    if 200 <= status < 300:
        APPROVAL_WEBHOOKS.labels("delivered").inc()
        logger.info("run=%s approval webhook delivered (%d)", run_id, status)
    else:
        APPROVAL_WEBHOOKS.labels("rejected").inc()
        logger.warning(
            "run=%s approval webhook answered %d: %s",
            run_id,
            status,
            # Scrubbed whole, then cut: a token cut in two would be missed.
            scrubbed(answer, url)[:LOGGED_BODY_CHARS],
        )


def event(run_id, approvals: list) -> dict:
    """The document posted: the run, each waiting call, where to decide."""
    prompt = (
        AgentRun.objects.filter(pk=run_id).values_list("request__prompt", flat=True).first() or ""
    )
    return {
        "event": EVENT,
        "sent_at": timezone.now().isoformat(),
        "run": {
            "id": str(run_id),
            "prompt": _shortened(prompt),
            "admin_path": reverse("admin:runs_agentrun_change", args=[run_id]),
        },
        "approvals": [
            {
                "id": approval.pk,
                "tool": approval.tool_name,
                "effect": approval.effect,
                "position": approval.position,
                "digest": approval.digest,
                "requested_at": approval.requested_at.isoformat(),
                "expires_at": approval.expires_at.isoformat(),
            }
            for approval in approvals
        ],
        "inbox_path": _inbox_path(run_id),
    }


def signature(body: bytes, secret: str) -> str:
    """The ``X-Nrllm-Signature-256`` value of ``body`` under ``secret``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _shortened(prompt) -> str:
    text = prompt if isinstance(prompt, str) else ""
    return text if len(text) <= PROMPT_CHARS else text[: PROMPT_CHARS - 1] + "…"


def _inbox_path(run_id) -> str:
    """The admin's approvals inbox, showing this run's calls."""
    return f"{reverse('admin:runs_approvals')}?run={run_id}"


def _headers(body: bytes) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "nrllm-ops approval webhook",
        "X-Nrllm-Event": EVENT,
    }
    if settings.NRLLM_APPROVAL_WEBHOOK_SECRET:
        headers[SIGNATURE_HEADER] = signature(body, settings.NRLLM_APPROVAL_WEBHOOK_SECRET)
    return headers


def post(
    url: str, body: bytes, headers: dict[str, str], *, seconds: float, host_allowed: bool
) -> tuple[int, str]:
    """POST ``body`` once to ``url`` as checked by the guard (``host_allowed``:
    ``check_url``'s), within ``seconds``; the status and the start of the
    answer. Raises ``ToolError`` (refused: nothing sent) or ``httpx.HTTPError``.
    The run-ended webhook (``runs.run_webhooks``) posts through it too.

    Holds no database connection: a receiver may take all of ``seconds``
    to answer, and the caller's pooled connection serves other runs
    meanwhile, as around a model call (a caller inside a transaction keeps
    its own)."""
    release_connection()
    target = check_url(url, host_allowed=host_allowed)
    # The deadline bounds the whole exchange (each connect, write and read
    # within what remains of it): a receiver that trickles its answer ends
    # with it. Resolving the name, before, is the system resolver's.
    transport = PinnedTransport(target.destination, Deadline(seconds))
    with (
        httpx.Client(
            transport=transport, timeout=httpx.Timeout(seconds), trust_env=False
        ) as client,
        client.stream("POST", target.url, content=body, headers=headers) as response,
    ):
        answer, _ = read_capped(response)
        return response.status_code, answer
