"""The run-ended webhook's outbox (G19): one row per time a run with a
``webhook_url`` reached ``completed``, ``failed``, ``cancelled`` or
``waiting_for_approval``, and where its delivery stands.

No Python code inserts these rows. A database trigger on the runs table
does (``runs/migrations/_run_events.py``), in the statement that changes
the run's status, whichever statement that is: a worker's settle, the
reaper's bulk UPDATE, an operator's cancel, the raw SQL of
``runs.transitions.step_journal``. So the event commits with the status
change or not at all, and a worker that dies after the settle has lost
nothing. The row holds what the POST will say, as it was at that moment.

``runs.run_webhooks`` delivers them. The model lives in a module of its
own, re-exported by ``runs.models`` where Django looks for it.
"""

from django.db import models

from spend.models import MONEY

#: The events, ``run.`` and the status the run reached.
EVENT_TYPES = [
    ("run.completed", "run.completed"),
    ("run.failed", "run.failed"),
    ("run.cancelled", "run.cancelled"),
    ("run.waiting_for_approval", "run.waiting_for_approval"),
    ("run.waiting_for_input", "run.waiting_for_input"),
]


class RunEvent(models.Model):
    """One run-ended event and its delivery: due at ``next_attempt_at``
    until ``delivered_at`` (a 2xx answer) or ``gave_up_at`` (after
    ``NRLLM_RUN_WEBHOOK_MAX_ATTEMPTS`` attempts) is set."""

    TEAM_FIELD = "run__team"

    #: The event id the receiver drops repeats by (``X-Nrllm-Event-Id``).
    id = models.UUIDField(primary_key=True, editable=False)
    #: Retention deletes the run's events with it.
    run = models.ForeignKey("runs.AgentRun", on_delete=models.CASCADE, related_name="events")
    event_type = models.CharField(max_length=32, choices=EVENT_TYPES)

    # What the run was at the moment of the event: the body says this,
    # however the run changes before the POST goes out.
    status = models.CharField(max_length=24)
    termination_reason = models.CharField(max_length=32, blank=True, db_default="")
    failure_class = models.CharField(max_length=16, blank=True, db_default="")
    #: Set by a second trigger, on the dead letter inserted in the same
    #: transaction as the ``failed`` status: the run was dead-lettered.
    dead_lettered = models.BooleanField(default=False, db_default=False)
    output = models.TextField(blank=True, db_default="")
    prompt_tokens = models.PositiveIntegerField(default=0, db_default=0)
    cached_prompt_tokens = models.PositiveIntegerField(default=0, db_default=0)
    completion_tokens = models.PositiveIntegerField(default=0, db_default=0)
    cost = models.DecimalField(**MONEY, default=0, db_default=0)
    #: Turns of unknown cost: while any, the body's cost is null (unknown, never 0).
    unpriced_turns = models.PositiveIntegerField(default=0, db_default=0)
    url = models.CharField(max_length=2000)
    occurred_at = models.DateTimeField()

    # The delivery. Every change is a guarded UPDATE in runs.run_webhooks.
    attempts = models.PositiveIntegerField(default=0, db_default=0)
    #: Due from then; a claim pushes it by the backoff before the POST.
    next_attempt_at = models.DateTimeField()
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    #: The last answer's HTTP status; null when none came (refused, no answer).
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    #: Why the last attempt failed; never the URL's path or query.
    last_error = models.TextField(blank=True, db_default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    gave_up_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["occurred_at"]
        indexes = [
            # The deliverers' query: undelivered events by due time. Only
            # those are in it, so it stays as small as the backlog.
            models.Index(
                fields=["next_attempt_at"],
                condition=models.Q(delivered_at__isnull=True, gave_up_at__isnull=True),
                name="run_event_due_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.id} of run {self.run_id}"

    @property
    def state(self) -> str:
        """``delivered``, ``gave_up`` or ``pending``."""
        if self.delivered_at is not None:
            return "delivered"
        if self.gave_up_at is not None:
            return "gave_up"
        return "pending"
