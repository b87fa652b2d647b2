"""The run-ended webhook (G19): each time a run with a ``webhook`` ends
(``completed``, ``failed``, ``cancelled``) or starts to wait for approval,
its URL is told, at least once.

The event is recorded by a database trigger in the statement that changed
the run's status (``runs.models.run_events``); from there, delivering it is this
package's:

- the process that ended the run — a worker, the embedded worker, the
  caller of an interactive run — tries it once, right after its attempt
  ended (the settle committed, the lease let go): ``deliver_new_events_of``;
- every reaper pass delivers every event that is due, the retries and
  what a dead worker left (``deliver_due``), a bounded number per pass.

``outbox`` holds the guarded statements, ``delivery`` one attempt. An
event is given up after ``NRLLM_RUN_WEBHOOK_MAX_ATTEMPTS`` attempts.
"""

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings

from runs.run_webhooks import delivery, outbox
from runs.run_webhooks.outbox import deliveries_of

__all__ = ["DeliveryReport", "deliver_due", "deliver_new_events_of", "deliveries_of"]

logger = logging.getLogger(__name__)

#: Events of one run its ender tries: one status change per attempt, and a
#: margin; a slow receiver costs the slot at most this many timeouts.
NEW_EVENTS_PER_RUN = 2


@dataclass
class DeliveryReport:
    #: How many attempts ended each way (``delivery``'s outcomes).
    outcomes: dict = field(default_factory=dict)

    def count(self, outcome: str) -> int:
        return self.outcomes.get(outcome, 0)

    def summary(self) -> str:
        return (
            f"webhooks delivered {self.count(delivery.DELIVERED)}, "
            f"not delivered {self.count(delivery.REJECTED) + self.count(delivery.FAILED)}"
        )


def deliver_due(*, as_of: datetime | None = None, deadline: float | None = None) -> DeliveryReport:
    """Every due event, longest due first, up to ``NRLLM_RUN_WEBHOOK_BATCH_SIZE``;
    none started after ``deadline`` (``time.monotonic()``). ``as_of``
    replaces the database's "now" (tests)."""
    due = outbox.due_events(limit=settings.NRLLM_RUN_WEBHOOK_BATCH_SIZE, as_of=as_of)
    return _deliver(due, as_of=as_of, deadline=deadline)


def deliver_new_events_of(run_id) -> DeliveryReport:
    """The events of ``run_id`` never tried yet, once each: what the process
    that ended the run does after its attempt. Never raises: what it
    could not do is the reaper's."""
    try:
        due = outbox.due_events(limit=NEW_EVENTS_PER_RUN, run_id=run_id, untried_only=True)
        return _deliver(due, as_of=None, deadline=None)
    except Exception:
        logger.exception("run=%s its webhook is left to the reaper", run_id)
        return DeliveryReport()


def _deliver(due, *, as_of, deadline) -> DeliveryReport:
    report = DeliveryReport()
    for event_id, attempts in due:
        if deadline is not None and time.monotonic() > deadline:
            break
        event = outbox.claim(event_id, attempts, as_of=as_of)
        if event is None:
            continue  # another deliverer took it, or it is no longer due
        outcome = delivery.attempt(event, as_of=as_of)
        report.outcomes[outcome] = report.count(outcome) + 1
    return report
