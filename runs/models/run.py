"""Runs, their append-only steps, dead letters, reconciliations of writes in
doubt, and approval requests.

A run row is the state of a run; an RQ job only wakes a worker up (G4). All
writes of ``status`` and of the lease fields go through ``runs.transitions``.
"""

import uuid

from django.conf import settings
from django.db import models

from runs.models.vocabulary import (
    LIVE_REQUEST_STATUSES,
    ApprovalStatus,
    DeadLetterReason,
    FailureClass,
    ReconciliationOutcome,
    Resolution,
    RunMode,
    RunStatus,
    StepKind,
    SubmittedVia,
    TerminationReason,
    WaitKind,
)
from spend.models import MONEY
from teams.models import DEFAULT_TEAM_ID
from tools.effects import ToolEffect

EFFECT_CHOICES = [(effect.value, effect.value) for effect in ToolEffect]


class AgentRun(models.Model):
    TEAM_FIELD = "team"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    request = models.JSONField()
    prompt = models.TextField()
    status = models.CharField(max_length=24, choices=RunStatus.choices)
    termination_reason = models.CharField(
        max_length=32, choices=TerminationReason.choices, blank=True
    )
    failure_class = models.CharField(max_length=16, choices=FailureClass.choices, blank=True)
    error_type = models.CharField(max_length=200, blank=True)
    error_message = models.TextField(blank=True)
    output = models.TextField(blank=True)
    mode = models.CharField(max_length=16, choices=RunMode.choices)
    #: Who submitted the run (the API token's or the session's user; None
    #: from the command line) and how: four-eyes approval (G14) reads it.
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # A database default too: rows inserted in SQL (the bench's) need none.
    submitted_via = models.CharField(
        max_length=16, choices=SubmittedVia.choices, blank=True, db_default=""
    )

    #: The team the run was started in (its agent's, G22); it never changes
    #: (a database trigger). Its steps, approvals, dead letters and
    #: reconciliations are its team's through it. A row inserted without
    #: one (in SQL) is the default team's.
    team = models.ForeignKey(
        "teams.Team",
        on_delete=models.PROTECT,
        related_name="+",
        db_default=DEFAULT_TEAM_ID,
        # run_team_created_idx leads with it: one index less on every insert.
        db_index=False,
    )

    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    #: Grows with every claim: it names the attempt, and guards every write of
    #: that attempt so a worker that lost the run matches nothing (G4, G5).
    lease_token = models.PositiveIntegerField(default=0)
    #: The write fence (G6): the effect of the write tool executing now...
    pending_effect = models.CharField(max_length=32, choices=EFFECT_CHOICES, blank=True)
    #: ...and that call (tool, arguments, idempotency key), stamped with it,
    #: so a write left in doubt can be shown to the operator who reconciles it.
    pending_call = models.JSONField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    requeue_count = models.PositiveIntegerField(default=0)
    #: Grows every time the run is put in the queue (created, retried,
    #: reaped, redispatched, requeued by an operator): its wake-up job is
    #: ``run-<id>-<dispatch_count>``, so no job id is ever used twice for a
    #: run, whatever resets the retry budget.
    dispatch_count = models.PositiveIntegerField(default=0)
    #: When a ``queued`` run is due (later than now while a retry backs off);
    #: the reaper re-dispatches a run long past due whose job Redis lost.
    available_at = models.DateTimeField(null=True, blank=True)
    #: Totals over the run's llm steps (OpenAI-compatible providers report them).
    prompt_tokens = models.PositiveIntegerField(default=0)
    #: Of ``prompt_tokens``, those the provider served from its cache.
    cached_prompt_tokens = models.PositiveIntegerField(default=0, db_default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    #: What the priced turns cost (G17), each at the price its attempt read
    #: with its claim; ``unpriced_turns`` had no price, and while there are
    #: any the run's cost is unknown (shown so, never as this sum).
    cost = models.DecimalField(**MONEY, default=0, db_default=0)
    unpriced_turns = models.PositiveIntegerField(default=0, db_default=0)
    llm_latency_ms = models.PositiveIntegerField(default=0)
    #: Steps recorded so far; the guarded UPDATE that records a step takes the
    #: next sequence from here, so two writers cannot allocate the same one.
    step_count = models.PositiveIntegerField(default=0)
    #: Steps the attempt holding the lease has recorded itself (its request,
    #: resume, model and tool steps), set by the claim. Each of its records
    #: is guarded on it: a record whose earlier steps a database server crash
    #: lost (they did not wait for the WAL flush, G12) matches nothing rather
    #: than land after a gap — on any connection, a pooler's included.
    attempt_steps = models.PositiveIntegerField(default=0, db_default=0)
    #: The run's journal (the model turns and tool outcomes a re-executed
    #: attempt replays, G12) is its llm and tool steps after this sequence:
    #: 0, or the operator step of the last restart from the beginning.
    journal_begins_after = models.PositiveIntegerField(default=0)
    #: Model tokens (prompt + completion) that resumed attempts did not spend
    #: again because they replayed recorded turns instead of asking anew.
    tokens_saved_by_replay = models.PositiveIntegerField(default=0)

    #: The agent version the run was started from (G18), or None for a run
    #: whose request was given whole. The request holds what it defined.
    agent_version = models.ForeignKey(
        "agents.AgentVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="runs"
    )
    #: The request's ``webhook``, told when the run ends (G19): a column, so
    #: that the database trigger that records the event reads it cheaply.
    webhook_url = models.CharField(max_length=2000, blank=True, default="", db_default="")
    #: The run this one reruns from a chosen model turn (G20), whose journal
    #: up to that turn it copied and replays. An id, not a foreign key: the
    #: original may be deleted by retention before its rerun, whose copied
    #: steps still name it; the original's reruns are found by this column.
    rerun_of = models.UUIDField(null=True, blank=True)
    #: The original's step (a model turn) this run goes live from.
    rerun_from_sequence = models.PositiveIntegerField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        permissions = [
            ("requeue_agentrun", "Can requeue runs that are safe to requeue"),
            ("cancel_agentrun", "Can cancel queued and running runs"),
            ("reconcile_agentrun", "Can reconcile writes in doubt"),
            ("approve_write", "Can approve or deny calls that wait for approval"),
            (
                "rerun_past_write",
                "Can rerun a run from a step before a non-idempotent write it recorded",
            ),
        ]
        indexes = [
            # With what the overview's charts group by (console.overview_charts):
            # its query over the window's runs reads this index alone.
            models.Index(
                fields=["-created_at"],
                include=["status", "termination_reason", "failure_class"],
                name="run_created_idx",
            ),
            # One per list filter, in the list's order: filtered pages are index scans.
            models.Index(fields=["status", "-created_at"], name="run_status_created_idx"),
            models.Index(
                fields=["termination_reason", "-created_at"], name="run_reason_created_idx"
            ),
            models.Index(fields=["failure_class", "-created_at"], name="run_failure_created_idx"),
            models.Index(fields=["mode", "-created_at"], name="run_mode_created_idx"),
            models.Index(
                fields=["pending_effect", "-created_at"],
                condition=~models.Q(pending_effect=""),
                name="run_fenced_idx",
            ),
            # No index holds lease_expires_at or step_count: a step's renewal
            # then changes no indexed column, and PostgreSQL writes it as a
            # heap-only (HOT) update instead of a new entry in every index
            # above. The reaper finds expired leases among the running runs
            # through run_status_created_idx; running runs are few (one per
            # busy worker), however many runs the table holds.
            models.Index(fields=["status", "available_at"], name="run_status_available_idx"),
            # A team member's runs list (G22): its page is an index scan.
            models.Index(fields=["team", "-created_at"], name="run_team_created_idx"),
            # A capped team's runs in flight, counted by every claim of its
            # runs (runs/migrations/_team_cap.py): at most its cap of entries.
            models.Index(
                fields=["team"],
                condition=models.Q(status="running"),
                name="run_team_running_idx",
            ),
            # A run page lists the run's reruns (G20).
            models.Index(
                fields=["rerun_of"],
                condition=models.Q(rerun_of__isnull=False),
                name="run_rerun_of_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.id} ({self.status})"

    @property
    def reconciliation(self) -> "WriteReconciliation | None":
        """The reconciliation of the write in question as the run stands now
        (its fence: this attempt's lease token and the call's idempotency
        key), or None. One made for an earlier write does not count. Lists
        prefetch ``reconciliations``; otherwise this is one query."""
        if not self.pending_effect:
            return None
        key = (self.pending_call or {}).get("idempotency_key", "")
        for reconciliation in self.reconciliations.all():
            if (reconciliation.lease_token, reconciliation.idempotency_key) == (
                self.lease_token,
                key,
            ):
                return reconciliation
        return None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def known_cost(self):
        """The run's cost, or None while any of its turns is unpriced."""
        return None if self.unpriced_turns else self.cost

    @property
    def is_terminal(self) -> bool:
        return self.status in RunStatus.terminal()


class RunStep(models.Model):
    """One thing that happened in a run. Inserted once, never updated (G11)."""

    TEAM_FIELD = "run__team"

    # No index of its own: step_sequence_unique's (run, sequence) index serves
    # every lookup by run, and each step is one index entry fewer to write.
    run = models.ForeignKey(
        AgentRun, on_delete=models.CASCADE, related_name="steps", db_index=False
    )
    sequence = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=StepKind.choices)
    tool_name = models.CharField(max_length=100, blank=True)
    #: The effect the tool executed under, as the code declared it then.
    effect = models.CharField(max_length=32, choices=EFFECT_CHOICES, blank=True)
    arguments = models.JSONField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    #: Set only for a step whose tool code ran (or, with ``replay_of``, whose
    #: recorded outcome was reused): the key the tool was given.
    idempotency_key = models.CharField(max_length=64, blank=True)
    #: History only. Before attempts resumed from the journal (G12), a
    #: re-executed run started over and a write call it had already recorded
    #: was copied into a new step naming the original here. Replayed steps
    #: are no longer copied: a ``resume`` step says what an attempt replayed.
    replay_of = models.PositiveIntegerField(null=True, blank=True)
    lease_token = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "sequence"]
        constraints = [
            models.UniqueConstraint(fields=["run", "sequence"], name="step_sequence_unique"),
        ]

    def __str__(self) -> str:
        return f"step {self.sequence} of run {self.run_id}"


class DeadLetter(models.Model):
    """A queued run that failed and will not be retried automatically, until
    an operator resolves it."""

    TEAM_FIELD = "run__team"

    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="dead_letters")
    reason = models.CharField(max_length=32, choices=DeadLetterReason.choices)
    failure_class = models.CharField(max_length=16, choices=FailureClass.choices, blank=True)
    error_type = models.CharField(max_length=200, blank=True)
    error_message = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    resolution = models.CharField(max_length=16, choices=Resolution.choices, blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution_note = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at"]
        permissions = [("dismiss_deadletter", "Can dismiss dead letters")]
        indexes = [
            # The open ones, newest first: the dead-letter list's default view.
            models.Index(
                fields=["-created_at"],
                condition=models.Q(resolved_at__isnull=True),
                name="dead_letter_open_idx",
            ),
            # The overview's "dead letters in the last 24 hours", open or not.
            models.Index(fields=["-created_at"], name="dead_letter_created_idx"),
        ]

    def __str__(self) -> str:
        return f"dead letter {self.reason} for run {self.run_id}"


class WriteReconciliation(models.Model):
    """An operator's finding on one write left in doubt: did it land or not.

    It is bound to that write — the attempt that left it in doubt (its lease
    token) and the call's idempotency key — and settles only that one: a
    later write left in doubt, or the same call left in doubt again by a
    later attempt, is in doubt again.
    """

    TEAM_FIELD = "run__team"

    #: A reconciliation outlives its run: retention (``prune_runs``) deletes
    #: a run past its age with everything else it holds, but an auditor may
    #: still ask what an operator found about its write. So no database
    #: constraint binds the row to its run, and the run's id stays as a name.
    run = models.ForeignKey(
        AgentRun,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="reconciliations",
    )
    #: The attempt whose fence stood on the write (the run's lease token then).
    lease_token = models.PositiveIntegerField()
    outcome = models.CharField(max_length=16, choices=ReconciliationOutcome.choices)
    note = models.TextField()
    #: The write in question, as the fence (or the step) showed it then.
    tool_name = models.CharField(max_length=100, blank=True)
    arguments = models.JSONField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=64, blank=True)
    operator = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # Two operators reconciling one write at once: one of them wins.
            models.UniqueConstraint(
                fields=["run", "lease_token", "idempotency_key"],
                name="reconciliation_one_per_write",
            )
        ]

    def __str__(self) -> str:
        return f"{self.outcome} for run {self.run_id}"


class ApprovalRequest(models.Model):
    """One call that waits for someone outside the worker, bound to it: the
    turn that asked for it, its place, tool, arguments and idempotency key,
    and a digest of them that a decision must carry. ``kind`` says for what:
    an operator's approval (G14), a person's answer to the agent's question,
    or another system's completion of a deferred call (G24).

    Written once by the park (``pending``), then once by the decision, the
    edit, the answer, the expiry or the cancel; a second decision of the
    same call matches nothing. An edit never changes a request: it marks it
    ``replaced`` and inserts the edited call as a new one.
    """

    TEAM_FIELD = "run__team"

    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="approvals")
    kind = models.CharField(
        max_length=16, choices=WaitKind.choices, default=WaitKind.APPROVAL, db_default="approval"
    )
    #: The attempt that asked and parked the run.
    lease_token = models.PositiveIntegerField()
    #: The llm step whose turn asked for the call, and the call's place in
    #: the run (``iteration.index``, as the idempotency key has it).
    turn_sequence = models.PositiveIntegerField()
    position = models.CharField(max_length=32)
    tool_name = models.CharField(max_length=100)
    #: The tool's effect when the call was asked for (from its class, G1).
    effect = models.CharField(max_length=32, choices=EFFECT_CHOICES)
    arguments = models.JSONField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=64)
    #: The idempotency key of the call as the model asked for it: the same
    #: as ``idempotency_key``, but for an edit (whose key is its arguments').
    #: A resumed attempt finds a decision by it (``runs.approvals.gate``).
    asked_key = models.CharField(max_length=64, blank=True, default="")
    #: The request this one replaced with edited arguments, and who edited.
    replaces = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    edited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    #: A question's answer, or a deferred call's completion, as recorded (the
    #: call's tool step holds what the model was told).
    answer = models.JSONField(null=True, blank=True)
    #: A deferred call: what the other system calls it (``Deferred.reference``).
    reference = models.CharField(max_length=200, blank=True, default="")
    #: sha256 of all of the above with the run's id (``runs.transitions.approvals.digest``).
    digest = models.CharField(max_length=64)
    #: ``policy`` (the tool's) or ``request`` (the run's request asked).
    required_by = models.CharField(max_length=16)
    status = models.CharField(max_length=16, choices=ApprovalStatus.choices)
    requested_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)
    #: The decision was made by the user who submitted the run.
    by_submitter = models.BooleanField(default=False)

    class Meta:
        ordering = ["requested_at", "position"]
        constraints = [
            # One live request per call of a turn: a second approval of the
            # same call is impossible. An expired, withdrawn or replaced one
            # does not count, so a run requeued after it may ask again, and
            # an edit's new request takes its original's place. Per kind: a
            # deferred write, approved, then waits for its completion too.
            models.UniqueConstraint(
                fields=["run", "turn_sequence", "position", "kind"],
                condition=models.Q(status__in=list(LIVE_REQUEST_STATUSES)),
                name="approval_one_live_per_call",
            )
        ]
        indexes = [
            # The inbox (oldest first) and the reaper's expiry look.
            models.Index(
                fields=["requested_at"],
                condition=models.Q(status=ApprovalStatus.PENDING),
                name="approval_pending_idx",
            ),
            models.Index(
                fields=["expires_at"],
                condition=models.Q(status=ApprovalStatus.PENDING),
                name="approval_expiry_idx",
            ),
            models.Index(fields=["-decided_at"], name="approval_decided_idx"),
            # A deferred call's completion finds its request by the call's key.
            models.Index(
                fields=["idempotency_key"],
                condition=models.Q(kind=WaitKind.DEFERRED),
                name="approval_deferred_key_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} at {self.position} of run {self.run_id} ({self.status})"
