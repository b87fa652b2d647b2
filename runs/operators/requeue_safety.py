"""The functions that decide whether an operator may requeue or restart a
run, and say what it will do or why not (G10, G12).

The admin and the API both call them and show their reasons.

- A **requeue** resumes the run from its journal: recorded model turns and
  tool outcomes are replayed, never repeated, and the run goes live after
  them. It is refused while a write is in doubt (``runs.models.selectors``' one
  definition: its outcome is not in the journal, and resuming would not
  settle it by running it again with its key) until an operator reconciles
  it, and when the journal could not be replayed.
- A **restart** runs the run again from the beginning, replaying nothing. It
  is refused whenever it could repeat a non-idempotent write, one in doubt
  included; it repeats idempotent writes by design.
"""

from dataclasses import dataclass, field

from runs.models import AgentRun
from runs.models.selectors import needs_reconciling
from runs.models.vocabulary import ReconciliationOutcome, RunStatus, StepKind
from runs.runtime.budget_watch import why_a_resume_stops
from runs.runtime.journal import Journal, JournalUnreplayable, read_journal_of
from runs.runtime.run_request import InvalidRunRequest, RunRequest, parse_stored_request
from spend.prices import Usage
from tools.approval_policy import tools_needing_approval
from tools.effects import ToolEffect
from tools.enabled import approval_overrides, disabled_tool_names
from tools.registry import effect_for, offered_tools

REQUEUEABLE = (RunStatus.FAILED, RunStatus.CANCELLED)


@dataclass(frozen=True)
class ToolPreview:
    name: str
    effect: str


@dataclass(frozen=True)
class RequeueVerdict:
    allowed: bool
    #: Stable, machine-readable: ``safe``, ``status``, ``request_invalid``,
    #: ``write_in_doubt``, ``write_applied``, ``journal_unreplayable``,
    #: ``max_iterations_reached``, ``run_limit_spent``, ``spend_unknown``,
    #: ``price_missing``, ``non_idempotent_executed``.
    code: str
    #: Why not, or what it will do.
    reason: str
    #: The tools the run offers, with their effects: what may execute live.
    tools: list[ToolPreview] = field(default_factory=list)
    #: For an allowed requeue: what it resumes from.
    journal: Journal | None = None


def requeue_safety(run: AgentRun) -> RequeueVerdict:
    """May ``run`` be requeued (resumed from its journal), and what will that
    do. The journal is read and checked as the resumed attempt will read it."""
    refused, request = _refused_for_status_or_doubt(run)
    if refused is not None:
        return refused
    disabled = disabled_tool_names() & set(request.tools)
    try:
        journal = read_journal_of(run.pk, request, disabled=disabled)
    except JournalUnreplayable as error:
        return RequeueVerdict(
            False,
            "journal_unreplayable",
            f"a resumed attempt would stop at once: {error}",
        )
    if len(journal.turns) >= request.max_iterations and journal.ends_with_whole_turn:
        return RequeueVerdict(
            False,
            "max_iterations_reached",
            f"the journal holds all {request.max_iterations} model turns the run may take "
            "(max_iterations), each call with its outcome: a resumed attempt would end "
            "max_iterations again; restart it from the beginning instead",
        )
    if not journal.ends_with_final_answer:
        code, why = why_a_resume_stops(
            request,
            run,
            turns=journal.turns,
            disabled=disabled,
            unreported_turns=journal.unreported_turns,
        )
        if code:
            return RequeueVerdict(
                False, code, f"a resumed attempt would stop before its next model call: {why}"
            )
    plan = _resume_plan(run, journal) + _approvals_to_ask(journal, request, disabled)
    return RequeueVerdict(True, "safe", plan, _tools(run), journal)


def restart_safety(run: AgentRun) -> RequeueVerdict:
    """May ``run`` be restarted from the beginning, replaying nothing."""
    refused, request = _refused_for_status_or_doubt(run, repeats_idempotent_writes=True)
    if refused is not None:
        return refused
    code, why = why_a_resume_stops(
        request,
        run,
        turns=(),
        disabled=disabled_tool_names() & set(request.tools),
        unreported_turns=lambda: _unreported_turns(run),
    )
    if code:
        return RequeueVerdict(False, code, f"its first model call would stop: {why}")
    executed = (
        run.steps.filter(kind=StepKind.TOOL, effect=ToolEffect.NON_IDEMPOTENT_WRITE)
        .exclude(idempotency_key="")
        .order_by("sequence")
        .values("sequence", "tool_name")
        .first()
    )
    if executed is not None:
        # A fresh start asks the model anew, and a real model need not ask
        # for the same call again: nothing could tell a repeat from a new call.
        return RequeueVerdict(
            False,
            "non_idempotent_executed",
            f"step {executed['sequence']} executed the non_idempotent_write "
            f"{executed['tool_name']!r}; running the run again from the beginning could "
            "repeat it (a requeue resumes after it instead)",
        )
    return RequeueVerdict(
        True,
        "safe",
        "safe to restart: it runs again from the beginning, replaying nothing",
        _tools(run),
    )


def _unreported_turns(run: AgentRun) -> int:
    """The run's model turns, over every attempt, whose usage is unknown:
    its totals count them as 0 tokens (a restart replays none of them)."""
    results = run.steps.filter(kind=StepKind.LLM).values_list("result", flat=True)
    usages = (Usage.of_result(result) for result in results.iterator())
    return sum(1 for usage in usages if usage is not None and not usage.reported)


def _tools(run: AgentRun) -> list[ToolPreview]:
    return [ToolPreview(name, effect_for(name).value) for name in run.request.get("tools", [])]


def _refused_for_status_or_doubt(
    run: AgentRun, *, repeats_idempotent_writes: bool = False
) -> tuple[RequeueVerdict | None, RunRequest]:
    """Why the run may not be requeued (or, ``repeats_idempotent_writes``,
    restarted), or None, and its stored request, parsed (once: a long
    script costs milliseconds)."""
    if run.status not in REQUEUEABLE:
        return RequeueVerdict(
            False,
            "status",
            f"only failed or cancelled runs can be requeued; this run is {run.status}",
        ), None
    try:
        request = parse_stored_request(run.request)
    except InvalidRunRequest as error:
        return RequeueVerdict(
            False,
            "request_invalid",
            f"the stored request no longer parses ({error}): the run cannot run again",
        ), None
    if not needs_reconciling(run):
        return None, request
    if repeats_idempotent_writes and run.pending_effect == ToolEffect.IDEMPOTENT_WRITE:
        # A restart asks the model anew and may repeat every idempotent
        # write the run made, worded otherwise (G10): this one too.
        return None, request
    # The run ended (status checked above) with its fence on a write only
    # an operator can settle (runs.models.selectors: a non-idempotent write, or an
    # idempotent one a resumed attempt would not run again with its key):
    # it may or may not have landed, and its outcome is not in the journal.
    return _unreconciled(run), request


def _unreconciled(run: AgentRun) -> RequeueVerdict | None:
    """Why the write on ``run``'s fence stops it from running again: in
    doubt (``runs.models.selectors.is_write_in_doubt``), or reconciled ``applied``;
    None once an operator reconciled it ``not_applied``."""
    tool = (run.pending_call or {}).get("tool", f"a {run.pending_effect}")
    # Only a reconciliation of this very write counts: one made for an
    # earlier write in doubt settles that write, not this one.
    reconciliation = run.reconciliation
    if reconciliation is None:
        return RequeueVerdict(
            False,
            "write_in_doubt",
            f"the {run.pending_effect} {tool!r} may have landed; reconcile it first",
        )
    if reconciliation.outcome == ReconciliationOutcome.APPLIED:
        return RequeueVerdict(
            False,
            "write_applied",
            f"{reconciliation.operator} reconciled the write {tool!r} as applied, and its "
            "outcome is not in the journal: running the run again would repeat it",
        )
    return None


def _fenced_call_reruns(run: AgentRun, journal: Journal) -> bool:
    """Whether the resumed attempt runs the fenced call again as recorded,
    with its idempotency key, or asks the model for its turn again (its
    turn may be gone: a write whose record a failover lost, G12): what the
    plan says of a write reconciled ``not_applied``."""
    key = (run.pending_call or {}).get("idempotency_key", "")
    return not key or journal.goes_live_with(run.pk, key)


def _approvals_to_ask(journal: Journal, request: RunRequest, disabled: set[str]) -> str:
    """What the plan adds when the journal ends in a turn whose calls still
    to run need an operator's approval: the resumed attempt waits again
    (G14; a wait that ended without the run going on left no decision)."""
    if not journal.turns:
        return ""
    last = journal.turns[-1]
    still_to_run = [call.name for call in last.turn.tool_calls[len(last.outcomes) :]]
    if not still_to_run:
        return ""
    needing = tools_needing_approval(
        offered_tools(request.tools, disabled),
        approval_overrides(request.tools),
        request.require_approval,
    )
    waiting = sorted({name for name in still_to_run if name in needing})
    if not waiting:
        return ""
    return f"; it waits for an operator's approval of {', '.join(waiting)} first"


def _resume_plan(run: AgentRun, journal: Journal) -> str:
    """What a requeue will do, in an operator's words."""
    replays = (
        f"resumes after step {journal.last_sequence}; replays {journal.writes} writes "
        f"without repeating them ({journal.model_turns} model turns and "
        f"{journal.tool_results} tool results in all)"
    )
    if not journal:
        plan = "nothing recorded to replay: it runs from the start"
    elif journal.ends_with_final_answer:
        plan = f"{replays}; the recorded final answer completes the run, no model call"
    else:
        plan = f"{replays}; continues live"
    if run.pending_effect:
        # The fenced call's outcome is not recorded: it executes again, live.
        tool = (run.pending_call or {}).get("tool", "the fenced write")
        if not _fenced_call_reruns(run, journal):
            plan += (
                f"; the {run.pending_effect} {tool!r}, reconciled not_applied, is not in the "
                "journal: the model is asked for its turn again"
            )
        elif run.pending_effect == ToolEffect.NON_IDEMPOTENT_WRITE:
            plan += f"; the write {tool!r}, reconciled not_applied, executes again"
        else:
            plan += (
                f"; the {run.pending_effect} {tool!r}, whose outcome is not recorded, "
                "executes again with the same idempotency key"
            )
    return plan
