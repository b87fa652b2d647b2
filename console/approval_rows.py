"""What the approvals inbox and the run page show of approvals (G14): the
pending calls grouped by the turn that asked, the steps that led to them,
the decided ones, and one readable line per approval step.

Everything here is text a model or a tool produced, or an operator typed:
the templates escape it; nothing here marks anything safe.
"""

import json

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from console.display import as_text, effect_badge, position_in_words, shortened
from runs.approvals.actions import APPROVE_PERMISSION, may_approve, may_decide
from runs.models import ApprovalRequest, RunStep
from runs.models.vocabulary import ApprovalStatus, StepKind, SubmittedVia
from teams import access

#: Seeing an approval request is seeing its run: the inbox's permission.
VIEW_PERMISSION = "runs.view_agentrun"

#: The pending calls the inbox shows at most (oldest first); more are counted.
PENDING_SHOWN = 50
#: The steps shown before a call (the latest ones up to its turn); the run
#: page has them all.
STEPS_BEFORE_CALL = 12
#: A step's arguments and outcome, in the steps that led to a call.
STEP_CHARS = 120


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


def pending_groups(user, run_id=None) -> tuple[list[dict], int]:
    """The pending calls of ``user``'s teams, oldest first, grouped by the
    run's turn that asked for them (one decision per call, but one story per
    turn), each with what ``user`` may do and, when they may not, why; and
    how many pending calls of its teams there are in all.

    A run waits on one turn at a time, so a group is a run. Queries: two,
    then one per group shown (its steps; two when they are cut): bounded by
    ``PENDING_SHOWN``. The gate reads the team and the submitter from the
    joined run, and the user's roles once, so deciding what a row offers
    adds none per call.
    """
    pending = visible(user).filter(status=ApprovalStatus.PENDING)
    if run_id is not None:
        pending = pending.filter(run_id=run_id)
    total = pending.count()
    # Oldest first, as the pending index (approval_pending_idx) has them.
    shown = pending.select_related("run", "run__submitted_by", "run__team").order_by(
        "requested_at", "position"
    )[:PENDING_SHOWN]
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
        groups[key]["calls"].append(_pending_call(approval, user, now))
    for group in groups.values():
        group["steps"], group["earlier_steps"] = steps_before(group["run"], group["turn_sequence"])
    return list(groups.values()), total


def _pending_call(approval: ApprovalRequest, user, now) -> dict:
    # The gate the decision itself passes (runs.approvals.actions), so the
    # row says what a click would be told.
    decide_refusal = may_decide(approval, user)
    approve_refusal = decide_refusal or may_approve(approval, user)
    return {
        "approval": approval,
        "badge": effect_badge(approval.effect),
        "arguments": arguments_rows(approval.arguments),
        "arguments_json": as_text(approval.arguments),
        "position_words": position_in_words(approval.position),
        # By this server's clock, for the page only: the decision itself
        # is refused past expiry by the database's (decide_approval).
        "overdue": approval.expires_at <= now,
        "may_decide": decide_refusal is None,
        # Why they may not decide it at all (not an approver in its team).
        "decide_refusal": decide_refusal.detail if decide_refusal is not None else "",
        "may_approve": approve_refusal is None,
        # Why they may deny but not approve: the tool is not the team's,
        # they are not a runner there, or four-eyes.
        "approve_refusal": (
            approve_refusal.detail if decide_refusal is None and approve_refusal else ""
        ),
    }


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


def decided(user, run_id=None):
    """The decided, expired and withdrawn requests of ``user``'s teams,
    latest first (the approval_decided_idx index), their deciders and runs
    joined."""
    rows = visible(user).exclude(status=ApprovalStatus.PENDING)
    if run_id is not None:
        rows = rows.filter(run_id=run_id)
    return rows.select_related("decided_by", "run").order_by("-decided_at", "-pk")


def history(run) -> list[ApprovalRequest]:
    """Every approval request of ``run``, in the order they were asked."""
    return list(run.approvals.select_related("decided_by").order_by("requested_at", "position"))
