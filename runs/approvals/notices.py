"""Telling the world that a run waits for approval (G14): the metrics, and
the webhook ``NRLLM_APPROVAL_WEBHOOK_URL`` when one is set.

Called by the attempt after its park committed. Best effort: nothing here
can change the run, and a webhook that fails is logged, not retried by the
run (``GET /api/approvals/?status=pending`` is the reliable way to learn
what waits).
"""

from django.conf import settings

from runs.approvals import webhook
from runs.models.metrics import APPROVAL_REQUESTS


def run_waits(run_id, approvals: list) -> None:
    """The run ``run_id`` was parked with ``approvals`` (its new requests)."""
    for approval in approvals:
        APPROVAL_REQUESTS.labels(approval.tool_name).inc()
    if settings.NRLLM_APPROVAL_WEBHOOK_URL and approvals:
        webhook.notify(run_id, approvals)
