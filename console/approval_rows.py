"""What the approvals inbox and the run page show of the calls that wait
for someone outside the worker: approvals (G14), edits of them, the
agent's questions and deferred calls (G24). The pending calls grouped by
the turn that asked, the steps that led to them, the decided ones, and one
readable line per approval or input step.

Everything here is text a model or a tool produced, or an operator typed:
the templates escape it; nothing here marks anything safe.
"""

import json

from django.db.models import Count, Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from console.display import as_text, effect_badge, position_in_words, shortened
from runs.approvals.actions import (
    APPROVE_PERMISSION,
    may_approve,
    may_decide,
    may_release_write,
)
from runs.approvals.answers import may_answer
from runs.models import ApprovalRequest, RunStep
from runs.models.vocabulary import ApprovalStatus, StepKind, SubmittedVia, WaitKind
from teams import access
from tools.registry import get_registry

#: Seeing an approval request is seeing its run: the inbox's permission.
VIEW_PERMISSION = "runs.view_agentrun"

#: The pending calls the inbox shows at most (oldest first); more are counted.
PENDING_SHOWN = 50
#: The steps shown before a call (the latest ones up to its turn); the run
#: page has them all.
STEPS_BEFORE_CALL = 12
#: A step's arguments and outcome, in the steps that led to a call.
STEP_CHARS = 120
#: The kinds a person acts on (approve, deny, edit; answer): the inbox's
#: first section. A deferred call waits for another system: listed apart.
FOR_PEOPLE = (WaitKind.APPROVAL, WaitKind.QUESTION)
#: The inbox's kind filter: each kind in the words of its link.
KIND_WORDS = {
    WaitKind.APPROVAL: "approvals",
    WaitKind.QUESTION: "questions",
    WaitKind.DEFERRED: "deferred calls",
}


def visible(user):
    """The approval requests ``user`` may see: those of runs of its teams
    (``teams.access``); another team's are simply not there."""
    return access.scoped(ApprovalRequest.objects.all(), user, VIEW_PERMISSION)


def decidable(user):
    """The requests a decision of ``user``'s may name: those it sees, or
    every one for a global ``runs.approve_write`` (the deployment's
    approver, who decided before teams without seeing runs, and still
    may). Another team's is then not found, as an unknown one."""
    if access.teams_with(user, APPROVE_PERMISSION) is access.EVERY:
        return ApprovalRequest.objects.all()
    return visible(user)


def pending_counts(user, run_id=None) -> dict[str, int]:
    """How many calls of ``user``'s teams wait, by kind (every kind a key),
    and ``all``: one query, on the pending index."""
    pending = visible(user).filter(status=ApprovalStatus.PENDING)
    if run_id is not None:
        pending = pending.filter(run_id=run_id)
    counts = pending.aggregate(
        all=Count("pk"),
        **{kind: Count("pk", filter=Q(kind=kind)) for kind in WaitKind.values},
    )
    return counts


def pending_groups(user, run_id=None, kinds=None) -> tuple[list[dict], int]:
    """The pending calls of ``user``'s teams (of ``kinds``, or of every
    kind), oldest first, grouped by the run's turn that asked for them (one
    decision per call, but one story per turn), each with what ``user`` may
    do and, when they may not, why; and how many such pending calls of its
    teams there are in all.

    A run waits on one turn at a time, so a group is a run. Queries: two,
    then one per group shown (its steps; two when they are cut): bounded by
    ``PENDING_SHOWN``. The gate reads the team and the submitter from the
    joined run, and the user's roles once, so deciding what a row offers
    adds none per call; an edited call's original and editor are joined.
    """
    pending = visible(user).filter(status=ApprovalStatus.PENDING)
    if run_id is not None:
        pending = pending.filter(run_id=run_id)
    if kinds is not None:
        pending = pending.filter(kind__in=list(kinds))
    total = pending.count()
    # Oldest first, as the pending index (approval_pending_idx) has them.
    shown = pending.select_related(
        "run", "run__submitted_by", "run__team", "replaces", "edited_by"
    ).order_by("requested_at", "position")[:PENDING_SHOWN]
    now = timezone.now()
    groups: dict[tuple, dict] = {}
    for approval in shown:
        key = (approval.run_id, approval.turn_sequence)
        if key not in groups:
            groups[key] = {
                "run": approval.run,
                "submitter": submitter(approval.run),
                "prompt": shortened(approval.run.prompt),
                "turn_sequence": approval.turn_sequence,
                "calls": [],
            }
        groups[key]["calls"].append(pending_call(approval, user, now))
    for group in groups.values():
        group["steps"], group["earlier_steps"] = steps_before(group["run"], group["turn_sequence"])
        # A run waits for one kind at a time: approvals, or one call's input.
        group["kind"] = group["calls"][0]["approval"].kind
    return list(groups.values()), total


def pending_call(approval: ApprovalRequest, user, now=None) -> dict:
    """One waiting call as a page shows it: what is asked, and what ``user``
    may do about it (or why not), by its kind. ``approval``'s run and team
    are best joined (``pending_groups``): the gate then reads no row."""
    now = now or timezone.now()
    row = {
        "approval": approval,
        "kind": approval.kind,
        "badge": effect_badge(approval.effect),
        "arguments": arguments_rows(approval.arguments),
        "arguments_json": as_text(approval.arguments),
        "arguments_short": shortened(approval.arguments),
        "position_words": position_in_words(approval.position),
        # By this server's clock, for the page only: the decision itself
        # is refused past expiry by the database's (decide_approval).
        "overdue": approval.expires_at <= now,
    }
    if approval.kind == WaitKind.QUESTION:
        row.update(_question(approval, user))
    elif approval.kind == WaitKind.APPROVAL:
        row.update(_approval(approval, user))
    return row


def _approval(approval: ApprovalRequest, user) -> dict:
    # The gate the decision itself passes (runs.approvals.actions), so the
    # row says what a click would be told.
    decide_refusal = may_decide(approval, user)
    approve_refusal = decide_refusal or may_approve(approval, user)
    # An edit releases nothing, but it writes the call that would run: its
    # editor must be able to make that write (G22), four-eyes aside.
    edit_refusal = decide_refusal or may_release_write(user, approval.run.team, approval.tool_name)
    tool = get_registry().get(approval.tool_name)
    return {
        "may_decide": decide_refusal is None,
        # Why they may not decide it at all (not an approver in its team).
        "decide_refusal": decide_refusal.detail if decide_refusal is not None else "",
        "may_approve": approve_refusal is None,
        # Why they may deny but not approve: the tool is not the team's,
        # they are not a runner there, or four-eyes (their own run, or
        # their own edit).
        "approve_refusal": (
            approve_refusal.detail if decide_refusal is None and approve_refusal else ""
        ),
        "may_edit": edit_refusal is None and tool is not None,
        "tool_gone": tool is None,
        "edit_json": editable_json(approval.arguments),
        "edit_rows": text_rows(editable_json(approval.arguments)),
        "edit": edit_of(approval),
    }


def editable_json(arguments) -> str:
    """A call's arguments as the edit form's text: JSON, indented, in the
    order the model gave them."""
    return json.dumps(arguments, indent=2, ensure_ascii=False)


def text_rows(text: str, *, least: int = 3, most: int = 16) -> int:
    """How many rows a textarea for ``text`` gets: its lines and one more."""
    return max(least, min(most, text.count("\n") + 2))


def edit_of(approval: ApprovalRequest) -> dict | None:
    """What an edit changed, for a call that is one (``replaces`` set):
    who edited it and each top-level argument before and after (changed
    ones marked); None for a call as the model asked for it."""
    if approval.replaces_id is None:
        return None
    before = approval.replaces.arguments if approval.replaces is not None else None
    after = approval.arguments
    if isinstance(before, dict) and isinstance(after, dict):
        names = list(before) + [name for name in after if name not in before]
        rows = [
            {
                "name": name,
                "before": shortened(before.get(name)) if name in before else None,
                "after": shortened(after.get(name)) if name in after else None,
                "changed": before.get(name, _ABSENT) != after.get(name, _ABSENT),
            }
            for name in names
        ]
    else:
        rows = [
            {"name": "", "before": shortened(before), "after": shortened(after), "changed": True}
        ]
    return {
        "editor": approval.edited_by.get_username() if approval.edited_by_id else "?",
        "original": approval.replaces_id,
        "rows": rows,
    }


_ABSENT = object()


def _question(request: ApprovalRequest, user) -> dict:
    asked = request.arguments if isinstance(request.arguments, dict) else {}
    schema = asked.get("answer_schema")
    refusal = may_answer(request, user)
    return {
        "question": asked.get("question", ""),
        "answer_schema": schema,
        "answer_schema_json": as_text(schema) if schema is not None else "",
        # With a schema the answer is JSON; without one, plain text.
        "answer_is_json": schema is not None,
        "may_answer": refusal is None,
        "answer_refusal": refusal.detail if refusal is not None else "",
    }


def deferred_rows(user, run_id=None) -> tuple[list[dict], int]:
    """The deferred calls of ``user``'s teams waiting for another system
    to complete them, oldest first (at most ``PENDING_SHOWN``), and how
    many there are. Two queries: nobody acts on them here."""
    pending = visible(user).filter(status=ApprovalStatus.PENDING, kind=WaitKind.DEFERRED)
    if run_id is not None:
        pending = pending.filter(run_id=run_id)
    total = pending.count()
    shown = pending.select_related("run").order_by("requested_at", "position")[:PENDING_SHOWN]
    now = timezone.now()
    return [pending_call(request, user, now) for request in shown], total


def arguments_rows(arguments) -> list[dict]:
    """A call's arguments, one row per top-level argument (name, value
    pretty-printed and cut), or one row without a name when they are not
    an object."""
    if isinstance(arguments, dict):
        return [{"name": name, "value": shortened(value)} for name, value in arguments.items()]
    return [{"name": "", "value": shortened(arguments)}]


def steps_before(run, turn_sequence: int) -> tuple[list[dict], int]:
    """The run's latest steps up to and including the turn that asked (its
    request step aside: the prompt is shown on its own), oldest first; and
    how many earlier ones are left out."""
    leading = RunStep.objects.filter(run=run, sequence__lte=turn_sequence).exclude(
        kind=StepKind.REQUEST
    )
    # Newest first on the (run, sequence) index, cut, then turned around.
    latest = list(leading.order_by("-sequence")[: STEPS_BEFORE_CALL + 1])
    earlier = 0
    if len(latest) > STEPS_BEFORE_CALL:
        earlier = leading.count() - STEPS_BEFORE_CALL
        latest = latest[:STEPS_BEFORE_CALL]
    return [step_row(step, turn_sequence) for step in reversed(latest)], earlier


def turn_calls(step: RunStep) -> list:
    """The calls a model turn's record asks for; [] for a record not in the
    shape of a turn (a page shows any row a database can hold, G12's
    ``journal_unreplayable`` ones included)."""
    result = step.result if isinstance(step.result, dict) else {}
    calls = result.get("tool_calls")
    return calls if isinstance(calls, list) else []


def turn_content(step: RunStep) -> str:
    """A model turn's answer text; "" for none, or a record not in the shape of one."""
    result = step.result if isinstance(step.result, dict) else {}
    content = result.get("content")
    return content if isinstance(content, str) else ""


def step_row(step: RunStep, turn_sequence: int | None = None) -> dict:
    """One step in a few words: kind, tool, short arguments and outcome."""
    if step.kind == StepKind.LLM:
        asked = [
            str(call.get("name", "?")) if isinstance(call, dict) else "?"
            for call in turn_calls(step)
        ]
        what = f"asks for {', '.join(asked)}" if asked else "answers"
        outcome = turn_content(step)
        arguments = ""
    elif step.kind == StepKind.APPROVAL:
        what, outcome, arguments = approval_summary(step), "", ""
    else:
        what = step.tool_name
        arguments = _one_line(step.arguments)
        outcome = step.error or _one_line(step.result)
    return {
        "step": step,
        "what": what,
        "badge": effect_badge(step.effect),
        "arguments": _cut(arguments),
        "outcome": _cut(outcome),
        "is_error": bool(step.error),
        "is_turn": step.sequence == turn_sequence,
    }


def _one_line(value) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _cut(text: str) -> str:
    return text if len(text) <= STEP_CHARS else text[:STEP_CHARS] + "…"


def approval_summary(step: RunStep) -> str:
    """An approval step as a sentence: which calls were asked for, or who
    decided which call, how, and why ("" for a step of another kind)."""
    if step.kind != StepKind.APPROVAL:
        return ""
    result = step.result or {}
    action = result.get("action", "")
    if action == "requested":
        calls = ", ".join(
            f"{call.get('tool', '?')} ({position_in_words(call.get('position', '?'))})"
            for call in result.get("calls", [])
        )
        return f"approval requested for {calls}; expires {_when(result.get('expires_at'))}"
    who = result.get("operator") or "?"
    own = " (the submitter's own)" if result.get("by_submitter") else ""
    note = f": {result['note']}" if result.get("note") else ""
    where = position_in_words(result.get("position", "?"))
    return f"{step.tool_name} ({where}) {action} by {who}{own}{note}"


def input_summary(step: RunStep) -> str:
    """An input step as a sentence: the question asked or the call handed
    on, who answered it or that another system completed it, or that the
    wait expired ("" for a step of another kind)."""
    if step.kind != StepKind.INPUT:
        return ""
    result = step.result if isinstance(step.result, dict) else {}
    action = result.get("action", "")
    if action == "requested":
        calls = result.get("calls") or [{}]
        call = calls[0] if isinstance(calls[0], dict) else {}
        expires = _when(result.get("expires_at"))
        if call.get("kind") == WaitKind.QUESTION:
            arguments = step.arguments if isinstance(step.arguments, dict) else {}
            return f"asks a person: {arguments.get('question', '?')}; expires {expires}"
        reference = f" ({call['reference']})" if call.get("reference") else ""
        return f"{step.tool_name} handed to another system{reference}; expires {expires}"
    where = position_in_words(result.get("position", "?"))
    note = f": {result['note']}" if result.get("note") else ""
    if action == "answered":
        return f"{step.tool_name} ({where}) answered by {result.get('operator') or '?'}{note}"
    if action == "completed":
        return f"{step.tool_name} ({where}) completed by the other system"
    if action == "expired":
        again = "; run again with the same key" if result.get("retry") else ""
        return f"{step.tool_name} ({where}): the wait expired{again}"
    return f"{step.tool_name} ({where}) {action}"


def _when(iso) -> str:
    moment = parse_datetime(iso) if isinstance(iso, str) else None
    if moment is None:
        return "?"
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S %Z")


def submitter(run) -> str:
    """Who submitted ``run``: a user's name, or how it came without one."""
    if run.submitted_by_id is not None:
        return run.submitted_by.get_username()
    return _SUBMITTED_WITHOUT_USER.get(run.submitted_via, "unknown (not recorded)")


_SUBMITTED_WITHOUT_USER = {
    SubmittedVia.COMMAND_LINE: "the command line",
    SubmittedVia.API: "the API (no user)",
}


def decided(user, run_id=None, kind=None):
    """The decided, replaced, answered, expired and withdrawn requests of
    ``user``'s teams (of ``kind``, or every kind), latest first (the
    approval_decided_idx index), their deciders and runs joined."""
    rows = visible(user).exclude(status=ApprovalStatus.PENDING)
    if run_id is not None:
        rows = rows.filter(run_id=run_id)
    if kind is not None:
        rows = rows.filter(kind=kind)
    return rows.select_related("decided_by", "run").order_by("-decided_at", "-pk")


def history(run) -> list[ApprovalRequest]:
    """Every approval request of ``run``, in the order they were asked."""
    return list(run.approvals.select_related("decided_by").order_by("requested_at", "position"))
