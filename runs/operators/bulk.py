"""Requeue, restart or cancel many runs at once, with a preview first — for
the admin's list and ``POST /api/runs/bulk/`` alike.

The preview gives each run the verdict its single-run action would give
(``requeue_safety``, ``restart_safety``, or whether it can be cancelled) and
changes nothing. Applying calls the single-run action on each run
(``runs.operators.actions``), so each run is decided again as it is then,
through its own guarded transition, and audited as every operator action
is (G11): a bulk action is only a loop over them. Nothing is done on a
verdict read earlier: a requeue or restart of a run the preview saw in
another state (a step added, its status changed) is refused ``changed``.

A verdict reads the run's journal, so one bulk action takes at most
``MAX_RUNS`` runs; a larger selection is refused whole, nothing done.
"""

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.db import DatabaseError

from runs.models import AgentRun
from runs.models.selectors import note_writes_in_doubt
from runs.models.vocabulary import ActionResult, RunStatus
from runs.operators import actions
from runs.operators.lasting_failure import lasting_failure
from runs.operators.requeue_safety import RequeueVerdict, requeue_safety, restart_safety

logger = logging.getLogger(__name__)

#: The most runs one bulk action touches. A requeue verdict reads and checks
#: the run's whole journal (a query, and the parse of every step): a preview
#: of this many runs of a few steps each took 0.3 s through the API and 0.5 s
#: as the admin's page; long journals cost more.
MAX_RUNS = 200


def cancel_verdict(run: AgentRun) -> RequeueVerdict:
    """Whether ``run`` can be cancelled, and what a cancel would do: the
    answer ``actions.cancel`` gives, without cancelling. In the verdicts'
    shape (``allowed``, ``code``, ``reason``), its refusal codes the
    action's own."""
    if run.status in RunStatus.terminal():
        return RequeueVerdict(False, "not_cancellable", f"the run has already ended ({run.status})")
    if run.status == RunStatus.RUNNING and run.cancel_requested_at is not None:
        return RequeueVerdict(False, "already_requested", "a cancel is already pending")
    if run.status == RunStatus.RUNNING:
        return RequeueVerdict(
            True, "cancellable", "running: its worker stops at the next step boundary"
        )
    return RequeueVerdict(True, "cancellable", f"{run.status}: cancelled at once, it will not run")


@dataclass(frozen=True)
class BulkAction:
    name: str
    #: The past participle the messages use: "requeued 7; refused 3".
    done: str
    #: The Django permission the single-run action needs.
    permission: str
    verdict: Callable[[AgentRun], RequeueVerdict]
    perform: Callable[..., ActionResult]
    #: Whether the verdict depends on the journal, so that a run changed
    #: since the preview must be previewed again. A cancel does not: a
    #: running run adds steps, and stopping it is what was asked.
    refuses_a_changed_run: bool


BULK_ACTIONS = {
    "requeue": BulkAction(
        "requeue", "requeued", "runs.requeue_agentrun", requeue_safety, actions.requeue, True
    ),
    "restart": BulkAction(
        "restart", "restarted", "runs.requeue_agentrun", restart_safety, actions.restart, True
    ),
    "cancel": BulkAction(
        "cancel", "cancelled", "runs.cancel_agentrun", cancel_verdict, actions.cancel, False
    ),
}


@dataclass(frozen=True)
class Seen:
    """A run as the preview saw it: what its verdict was made on."""

    status: str
    step_count: int

    def __str__(self) -> str:
        return f"{self.status}:{self.step_count}"

    @classmethod
    def parse(cls, text: str) -> "Seen | None":
        status, _, count = text.partition(":")
        if status not in RunStatus.values or not count.isdigit():
            return None
        return cls(status, int(count))


@dataclass(frozen=True)
class RunVerdict:
    """One run's line of a preview."""

    run: AgentRun
    verdict: RequeueVerdict
    #: Why running it again would likely fail the same way ("" if no reason).
    warning: str = ""

    @property
    def seen(self) -> Seen:
        return Seen(self.run.status, self.run.step_count)


@dataclass(frozen=True)
class RunResult:
    run_id: str
    result: ActionResult
    #: For a preview: the run as its verdict saw it (``str(Seen)``).
    seen: str | None = None


@dataclass(frozen=True)
class Tally:
    """How many runs were (or would be) done, and the rest by refusal code."""

    done: int = 0
    refused: Counter = field(default_factory=Counter)

    @classmethod
    def of(cls, outcomes: Iterable[tuple[bool, str]]) -> "Tally":
        outcomes = list(outcomes)
        return cls(
            sum(1 for ok, _ in outcomes if ok),
            Counter(code for ok, code in outcomes if not ok),
        )

    @property
    def refused_count(self) -> int:
        return sum(self.refused.values())

    def says(self, done_word: str) -> str:
        """e.g. "requeued 7; refused 3: write_in_doubt 2, status 1"."""
        text = f"{done_word} {self.done}"
        if self.refused:
            by_code = ", ".join(f"{code} {count}" for code, count in self.refused.most_common())
            text += f"; refused {self.refused_count}: {by_code}"
        return text


def runs_for_preview(queryset) -> list[AgentRun]:
    """The runs of ``queryset`` (at most ``MAX_RUNS``, newest first) with
    what their verdicts read prefetched: their reconciliations, in one
    query for all of them, and whether their idempotent writes are in
    doubt (``runs.models.selectors``), in one more."""
    runs = list(queryset.prefetch_related("reconciliations").order_by("-created_at")[:MAX_RUNS])
    note_writes_in_doubt(runs)
    return runs


def too_many(queryset) -> bool:
    """Whether ``queryset`` holds more runs than one bulk action takes;
    counted no further than that."""
    return queryset.order_by()[: MAX_RUNS + 1].count() > MAX_RUNS


def preview(action: BulkAction, runs: Iterable[AgentRun]) -> list[RunVerdict]:
    """Each run's verdict for ``action``; changes nothing. A requeue or
    restart that is allowed but would likely fail the same way again says
    so (``lasting_failure``)."""
    lines = []
    for run in runs:
        verdict = action.verdict(run)
        warning = lasting_failure(run) if verdict.allowed and action.name != "cancel" else ""
        lines.append(RunVerdict(run, verdict, warning))
    return lines


def apply(
    action: BulkAction, run_ids: Iterable, operator, note: str, seen: dict | None = None
) -> list[RunResult]:
    """Carry out ``action`` on each run, in order, through its single-run
    action: each run is read again and decided as it is now. ``seen`` (run
    id → ``Seen``) is what a preview showed: a run no longer as it was
    there is refused ``changed`` where the action's verdict reads the
    journal. One run's refusal, or its database error (its action rolled
    back whole), does not stop the others."""
    seen = seen or {}
    results = []
    for run_id in run_ids:
        results.append(RunResult(str(run_id), _apply_one(action, run_id, operator, note, seen)))
    return results


def failed_again(run_ids: Iterable) -> list[AgentRun]:
    """Those of ``run_ids`` — runs a requeue or restart sent back to the
    queue — that have ended ``failed`` again since, as they are read now
    (one query; oldest first). A run sent back is queued: failed, an
    attempt after it failed (one queued for a retry has not ended)."""
    return list(
        AgentRun.objects.filter(pk__in=list(run_ids), status=RunStatus.FAILED)
        .only("pk", "created_at", "termination_reason", "failure_class")
        .order_by("created_at", "pk")
    )


def _apply_one(action: BulkAction, run_id, operator, note: str, seen: dict) -> ActionResult:
    run = AgentRun.objects.filter(pk=run_id).first()
    if run is None:
        return ActionResult(False, "not_found", "no such run (deleted since?)")
    shown = seen.get(str(run_id))
    if (
        action.refuses_a_changed_run
        and shown is not None
        and shown != Seen(run.status, run.step_count)
    ):
        return ActionResult(
            False,
            "changed",
            f"the run changed since the preview (it was {shown.status} with "
            f"{shown.step_count} steps, it is {run.status} with {run.step_count}): preview again",
        )
    try:
        return action.perform(run, operator, note)
    except DatabaseError:
        # The action and its step are one transaction: nothing of it happened.
        logger.exception("run=%s bulk %s failed on a database error", run_id, action.name)
        return ActionResult(
            False, "database_error", "the database could not complete it; nothing was changed"
        )
