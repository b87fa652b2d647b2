"""Whether a run may be rerun from a chosen model turn, and what that will
do (G20).

A rerun makes a **new** run that replays the original's journal before the
chosen turn and goes live at it: the model is asked that turn anew, with
the same or an edited request. Everything the original did from that turn
on may happen again, so the verdict lists the writes it recorded there, by
effect:

- a ``non_idempotent_write`` executed after the turn (or one in doubt on
  the original's fence, or reconciled ``applied``) refuses the rerun unless
  the operator confirms it (and holds ``runs.rerun_past_write``, checked by
  the action); the new run then asks an operator's approval before any call
  of that tool (G14), so it is never executed again unasked;
- an ``idempotent_write`` is listed: running it again has the effect of once.

The prefix is read and checked as a resumed attempt reads a journal
(``read_journal_of`` up to the turn), against the request the new run will
have: a prefix that calls a tool the new request does not offer, or that
holds all the turns it may take, is refused rather than replayed.
"""

from dataclasses import dataclass, field, replace

from django.db.models import Q

from runs.models import AgentRun
from runs.models.vocabulary import ReconciliationOutcome, RunStatus, StepKind
from runs.runtime.journal import Journal, JournalUnreplayable, read_journal_of
from runs.runtime.run_request import InvalidRunRequest, RunRequest, parse_run_request
from tools.effects import ToolEffect
from tools.enabled import disabled_tool_names

_WRITES = (ToolEffect.IDEMPOTENT_WRITE, ToolEffect.NON_IDEMPOTENT_WRITE)


@dataclass(frozen=True)
class WriteAfter:
    """A write the original recorded at or after the chosen turn."""

    #: Its tool step, or None for the write in doubt on the original's fence.
    sequence: int | None
    tool: str
    effect: str
    #: ``executed`` (its tool code ran), ``returned_late`` (it returned after
    #: its time limit: it landed), ``in_doubt`` (it may have landed) or
    #: ``applied`` (an operator reconciled it as landed).
    state: str
    #: The run that recorded it when that is not the run rerun but the run
    #: it reruns (G20: its turns stand for that run's history), else None.
    run: str | None = None


@dataclass(frozen=True)
class RerunVerdict:
    allowed: bool
    #: Stable, machine-readable: ``safe``, ``status``, ``not_a_turn``,
    #: ``request_invalid``, ``journal_unreplayable``, ``tool_not_offered``,
    #: ``max_iterations_reached``, ``past_write``.
    code: str
    #: What it will do, or why not, in an operator's words.
    reason: str
    sequence: int
    writes_after: list[WriteAfter] = field(default_factory=list)
    #: The prefix the new run replays (allowed verdicts only).
    journal: Journal | None = None
    #: The request the new run gets: the approvals G20 adds included.
    request: RunRequest | None = None

    @property
    def past_write(self) -> bool:
        """A non-idempotent write after the turn: it takes a confirmation."""
        return any(write.effect == ToolEffect.NON_IDEMPOTENT_WRITE for write in self.writes_after)


def rerun_verdict(
    run: AgentRun,
    sequence: int,
    *,
    request_data: dict | None = None,
    past_write_confirmed: bool = False,
) -> RerunVerdict:
    """May ``run`` be rerun from its model turn at step ``sequence``, with
    ``request_data`` (a whole request; None: the run's own), and what will
    that do. ``past_write_confirmed``: the operator confirmed a rerun past a
    non-idempotent write (whether they may is the action's check)."""
    refused = _not_a_turn(run, sequence)
    if refused:
        return RerunVerdict(False, *refused, sequence)
    writes = writes_after(run, sequence)
    try:
        request = parse_run_request(_with_approvals(request_data or run.request, writes))
    except InvalidRunRequest as error:
        return RerunVerdict(
            False, "request_invalid", f"the rerun's request is refused: {error}", sequence, writes
        )
    disabled = disabled_tool_names() & set(request.tools)
    try:
        journal = read_journal_of(run.pk, request, disabled=disabled, before=sequence)
    except JournalUnreplayable as error:
        return RerunVerdict(
            False,
            "journal_unreplayable",
            f"the steps before step {sequence} cannot be replayed: {error}",
            sequence,
            writes,
        )
    offered = run.request.get("tools", []) if isinstance(run.request, dict) else []
    refused = _prefix_refused(journal, request, offered)
    if refused:
        return RerunVerdict(False, *refused, sequence, writes)
    non_idempotent = [w for w in writes if w.effect == ToolEffect.NON_IDEMPOTENT_WRITE]
    if non_idempotent and not past_write_confirmed:
        first = non_idempotent[0]
        return RerunVerdict(
            False,
            "past_write",
            f"{_described(first)} after step {sequence}: a rerun from there could repeat "
            "it. An operator with the permission runs.rerun_past_write may confirm the "
            "rerun; the new run then asks an "
            f"operator's approval before any call of {_tools_of(non_idempotent)}",
            sequence,
            writes,
        )
    plan = _plan(journal, sequence, writes)
    return RerunVerdict(True, "safe", plan, sequence, writes, journal, request)


def writes_after(run: AgentRun, sequence: int) -> list[WriteAfter]:
    """The writes ``run`` recorded from its step ``sequence`` on: the tool
    steps whose code ran (they carry an idempotency key), a write that
    returned after its time limit (a ``late_result``: it landed, whatever an
    operator reconciled before it did), and the write in doubt on its fence
    unless it was reconciled ``not_applied``."""
    steps = list(
        run.steps.filter(sequence__gt=sequence, effect__in=_WRITES)
        .filter(Q(kind=StepKind.TOOL) | Q(kind=StepKind.LATE_RESULT, error=""))
        .exclude(idempotency_key="")
        .order_by("sequence")
        .values_list("sequence", "tool_name", "effect", "kind", "idempotency_key")
    )
    writes = [
        WriteAfter(seq, tool, effect, "executed" if kind == StepKind.TOOL else "returned_late")
        for seq, tool, effect, kind, _ in steps
    ]
    returned = {key for *_, kind, key in steps if kind == StepKind.LATE_RESULT}
    fenced = run.pending_call or {}
    if (
        run.pending_effect in _WRITES
        and run.is_terminal
        and fenced.get("idempotency_key") not in returned
    ):
        reconciliation = run.reconciliation
        if reconciliation is None or reconciliation.outcome == ReconciliationOutcome.APPLIED:
            writes.append(
                WriteAfter(
                    None,
                    fenced.get("tool", ""),
                    run.pending_effect,
                    "in_doubt" if reconciliation is None else "applied",
                )
            )
    return writes + _original_writes_after(run)


def _original_writes_after(run: AgentRun) -> list[WriteAfter]:
    """For a rerun: the writes its original recorded after the turn the
    rerun went live at (and so on up the chain) — as its first step holds
    them, and as the original holds them now (it may have gone on since).
    Every step of the rerun stands before them — a copied turn is the
    original's before that turn, a live one after it in a new branch — so a
    rerun of the rerun from any of its steps could repeat them. The first
    step keeps them when retention deleted the original."""
    if run.rerun_of is None:
        return []
    original_id = str(run.rerun_of)
    first = run.steps.filter(sequence=1).values_list("result", flat=True).first() or {}
    writes = [
        WriteAfter(**{**w, "run": w.get("run") or original_id})
        for w in first.get("writes_after", [])
    ]
    original = AgentRun.objects.filter(pk=run.rerun_of).first()
    if original is not None:
        writes += [
            write if write.run else replace(write, run=original_id)
            for write in writes_after(original, run.rerun_from_sequence)
        ]
    return list(dict.fromkeys(writes))


def _not_a_turn(run: AgentRun, sequence: int) -> tuple[str, str] | None:
    """Why step ``sequence`` of ``run`` cannot be rerun from: the run has
    not ended, or the step is no model turn of its journal."""
    if run.status not in RunStatus.terminal():
        return "status", f"only an ended run can be rerun; this run is {run.status}"
    kind = run.steps.filter(sequence=sequence).values_list("kind", flat=True).first()
    if kind is None:
        return "not_a_turn", f"the run has no step {sequence}"
    if kind != StepKind.LLM:
        return (
            "not_a_turn",
            f"step {sequence} is a {kind} step; a rerun goes live at a model turn (an llm step)",
        )
    if sequence <= run.journal_begins_after:
        return (
            "not_a_turn",
            f"step {sequence} is before the run's restart from the beginning (step "
            f"{run.journal_begins_after}): pick a model turn after it",
        )
    return None


def _with_approvals(request_data, writes: list[WriteAfter]):
    """The request with every non-idempotent write tool recorded after the
    turn added to ``require_approval`` (among the tools it offers): the new
    run asks before such a call, whatever the model words it as (G20)."""
    if not isinstance(request_data, dict):
        return request_data
    tools = request_data.get("tools")
    if not isinstance(tools, list):
        return request_data
    asked = request_data.get("require_approval") or []
    if not isinstance(asked, list):
        return request_data
    added = [
        write.tool
        for write in writes
        if write.effect == ToolEffect.NON_IDEMPOTENT_WRITE
        and write.tool in tools
        and write.tool not in asked
    ]
    if not added:
        return request_data
    return {**request_data, "require_approval": [*asked, *dict.fromkeys(added)]}


def _prefix_refused(
    journal: Journal, request: RunRequest, offered_before
) -> tuple[str, str] | None:
    """Why the prefix cannot be replayed under the new request: a call of a
    tool the original offered (``offered_before``) and the new request does
    not (a call of a tool never offered was told so, as it will be again),
    or every turn it may take used already."""
    for recorded in journal.turns:
        for call, outcome in zip(recorded.turn.tool_calls, recorded.outcomes, strict=False):
            if not call.problem and call.name in offered_before and call.name not in request.tools:
                return (
                    "tool_not_offered",
                    f"step {outcome.sequence} records the tool {call.name!r}, which the "
                    "rerun's request does not offer: replaying it would tell the model of a "
                    "call it could not have made",
                )
    if len(journal.turns) >= request.max_iterations:
        return (
            "max_iterations_reached",
            f"the steps before it hold {len(journal.turns)} model turns, all the "
            f"{request.max_iterations} the request may take (max_iterations)",
        )
    return None


def _plan(journal: Journal, sequence: int, writes: list[WriteAfter]) -> str:
    """What the rerun will do, in an operator's words."""
    if journal:
        plan = (
            f"a new run replays the {journal.model_turns} model turns and "
            f"{journal.tool_results} tool results before step {sequence} ({journal.writes} "
            f"writes, not repeated) and asks the model anew from step {sequence}"
        )
    else:
        plan = f"a new run asks the model anew from step {sequence}, the first model turn"
    idempotent = [w for w in writes if w.effect == ToolEffect.IDEMPOTENT_WRITE]
    if idempotent:
        plan += (
            f"; the idempotent_write {_tools_of(idempotent)} recorded after it may run again "
            "(running it again has the effect of once)"
        )
    non_idempotent = [w for w in writes if w.effect == ToolEffect.NON_IDEMPOTENT_WRITE]
    if non_idempotent:
        plan += (
            f"; confirmed past the non_idempotent_write {_tools_of(non_idempotent)}: the new "
            "run asks an operator's approval before any call of it"
        )
    return plan


def _described(write: WriteAfter) -> str:
    what = f"the {write.effect} {write.tool!r}"
    if write.state == "returned_late":
        text = f"step {write.sequence} recorded {what} returning after its time limit: it landed"
    elif write.state == "in_doubt":
        text = f"{what}, in doubt on the run's fence, may have landed"
    elif write.state == "applied":
        text = f"{what} was reconciled as applied"
    else:
        text = f"step {write.sequence} executed {what}"
    return f"{text} (in run {write.run}, which this run reruns)" if write.run else text


def _tools_of(writes: list[WriteAfter]) -> str:
    return ", ".join(repr(name) for name in dict.fromkeys(write.tool for write in writes))
