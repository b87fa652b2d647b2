"""Approving and denying a call that waits (G14), for the admin and the API.

Who may decide is checked here, whatever the caller checked: a crafted
request changes nothing. A refusal leaves the call waiting for someone who
may decide it.

- **Deny** needs the approver role in the run's team (``runs.approve_write``
  there): a denial executes nothing.
- **Approve** releases a write, so it needs the right to make that write
  (G22, ``may_release_write``): approver in the run's team, the tool one the
  team may use now, and runner in that team — the approver could have
  started a run with that tool themselves. Then four-eyes: with
  ``NRLLM_APPROVAL_SECOND_PERSON`` the user who submitted the run may deny
  its calls but not approve them.

A global permission is its role in every team (G22): a user holding
``runs.approve_write`` globally approves in a team only if they may also
start runs there (``runs.add_agentrun``, globally or as a runner), and
the team's tools bind them as anyone.

The decision, its step on the run, the admin log entry and (for the last
call of the turn) the run's release commit together or not at all; the
run's job is dispatched after that commit.
"""

from django.conf import settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import transaction

from runs import transitions
from runs.models import AgentRun, ApprovalRequest
from runs.models.metrics import APPROVAL_DECISION_SECONDS, APPROVAL_DECISIONS
from runs.models.vocabulary import ActionResult, ApprovalStatus, RunStatus, WaitKind
from runs.queue.dispatch import dispatch_or_fail
from runs.transitions import DecisionOutcome
from teams import access
from teams.models import Team
from tools.canonical import MAX_JSON_DEPTH, as_journaled, nested_deeper_than
from tools.registry import get_registry
from tools.validation import argument_errors

APPROVE_PERMISSION = "runs.approve_write"
#: Starting a run: who may release a write must hold it in the write's team.
RUN_PERMISSION = "runs.add_agentrun"
#: A decision's note, at most: the API and the inbox refuse a longer one (a
#: denial's note is the model's tool result, and is in the step and the log).
MAX_NOTE_CHARS = 10_000

#: The refusals that are the user's, not the call's state (the API's 403s):
#: no approver role anywhere, or not in the run's team; the tool not the
#: team's; not a runner there; four-eyes.
REFUSED_TO_USER = frozenset(
    {
        "permission_denied",
        "not_approver",
        "tool_not_in_team",
        "not_runner",
        "second_person_required",
    }
)
#: The refusals of the team-bound gate (G22), as opposed to four-eyes.
TEAM_GATE_CODES = frozenset({"permission_denied", "not_approver", "tool_not_in_team", "not_runner"})


def approve(approval: ApprovalRequest, operator, *, digest: str, note: str = "") -> ActionResult:
    """Approve the call ``approval`` names, as the operator saw it (``digest``)."""
    return _decide(approval, operator, approved=True, digest=digest, note=note)


def deny(approval: ApprovalRequest, operator, *, digest: str, note: str = "") -> ActionResult:
    """Deny it: it never executes, and the model is told (with ``note``)."""
    return _decide(approval, operator, approved=False, digest=digest, note=note)


def may_decide_in(user, team: Team) -> ActionResult | None:
    """Why ``user`` may decide no call of ``team`` (or None): they need the
    approver role there. Enough to deny."""
    if not access.may_somewhere(user, APPROVE_PERMISSION):
        return ActionResult(
            False,
            "permission_denied",
            "you are an approver in no team: deciding needs the permission "
            f"{APPROVE_PERMISSION!r} (the approver role) in the call's team",
        )
    if not access.may(user, APPROVE_PERMISSION, team.pk):
        return ActionResult(
            False,
            "not_approver",
            f"you are not an approver in team {team.slug!r}: deciding its calls needs "
            f"the approver role there ({APPROVE_PERMISSION})",
        )
    return None


def may_release_write(user, team: Team, tool_name: str) -> ActionResult | None:
    """Why ``user`` may not release a write of ``tool_name`` in ``team`` (or
    None), checked in this order, the first failure named:

    - ``not_approver``: they hold no approver role in the team;
    - ``tool_not_in_team``: the team may not use the tool now (its tool set
      as it stands, not as it was when the run started);
    - ``not_runner``: they could not start a run with it themselves (no
      runner role in the team).

    Whatever lets a person's decision send a write on — an approval, an
    edit (G24) — passes this one gate. (An answer to the agent's question
    sends no write on by itself: it takes the runner role, ``answers``.) An
    approval is judged again inside its transaction, under locks on the
    team's row and the approver's memberships in it
    (``teams.access.held_still``): a change of the team's tools or a
    removal of the approver either commits before the decision, which then
    sees it, or waits for it. A global permission taken away meanwhile is
    not locked: platform staff's grants are read as the request began."""
    refused = may_decide_in(user, team)
    if refused is not None:
        return refused
    if not team.may_use(tool_name):
        return ActionResult(
            False,
            "tool_not_in_team",
            f"team {team.slug!r} may not use the tool {tool_name!r} now: its calls cannot "
            "be approved until a team admin gives the team that tool again; you may deny it",
        )
    if not access.may(user, RUN_PERMISSION, team.pk):
        return ActionResult(
            False,
            "not_runner",
            f"you are not a runner in team {team.slug!r}: you may approve only a write you "
            "could make yourself (runner and approver in the run's team); you may deny it",
        )
    return None


def may_decide(approval: ApprovalRequest, operator) -> ActionResult | None:
    """Why ``operator`` may not decide ``approval`` at all, not even deny it
    (or None)."""
    facts = RunFacts.of(approval)
    if facts is None:
        return _GONE
    return may_decide_in(operator, facts.team)


def may_approve(approval: ApprovalRequest, operator) -> ActionResult | None:
    """Why ``operator`` may not approve ``approval`` (or None): the gate of
    the write it releases (``may_release_write``), then four-eyes."""
    facts = RunFacts.of(approval)
    if facts is None:
        return _GONE
    return _approval_refused(approval, operator, facts)


def _approval_refused(approval, operator, facts: "RunFacts") -> ActionResult | None:
    refused = may_release_write(operator, facts.team, approval.tool_name)
    if refused is not None:
        return refused
    if settings.NRLLM_APPROVAL_SECOND_PERSON and facts.is_submitter(operator):
        return ActionResult(
            False,
            "second_person_required",
            "you submitted this run: another operator must approve its calls "
            "(NRLLM_APPROVAL_SECOND_PERSON); you may deny them",
        )
    if settings.NRLLM_APPROVAL_SECOND_PERSON and approval.edited_by_id == operator.pk:
        return ActionResult(
            False,
            "second_person_required",
            "you edited this call: another approver must approve your edit "
            "(NRLLM_APPROVAL_SECOND_PERSON); you may deny it or edit it again",
        )
    return None


_GONE = ActionResult(False, "not_found", "no such approval request")
_NOT_AN_APPROVAL = ActionResult(
    False,
    "not_an_approval",
    "this call waits for an answer or a completion, not for an approval: it is not "
    "approved, denied or edited",
)


class RunFacts:
    """What the gate reads of an approval's run: its team (set at insert,
    never changed: a database trigger refuses it) and its submitter (set
    once, at insert). So a row the caller joined is as good as one read now."""

    def __init__(self, team: Team, submitted_by_id):
        self.team = team
        self.submitted_by_id = submitted_by_id

    @classmethod
    def of(cls, approval: ApprovalRequest) -> "RunFacts | None":
        if ApprovalRequest.run.is_cached(approval):
            # Joined by the caller (the inbox lists its calls so).
            run = approval.run
            team = run.team if AgentRun.team.is_cached(run) else Team.objects.get(pk=run.team_id)
            return cls(team, run.submitted_by_id)
        row = (
            AgentRun.objects.filter(pk=approval.run_id)
            .values_list("team_id", "submitted_by_id")
            .first()
        )
        if row is None:
            return None
        team_id, submitted_by_id = row
        return cls(Team.objects.get(pk=team_id), submitted_by_id)

    def held_still(self, operator) -> "RunFacts":
        """These facts with the team's row and ``operator``'s memberships in
        it locked (``teams.access.held_still``): a release judged on them
        is judged on what commits before it."""
        return RunFacts(access.held_still(operator, self.team.pk), self.submitted_by_id)

    def is_submitter(self, operator) -> bool:
        return self.submitted_by_id is not None and self.submitted_by_id == operator.pk


def _decide(
    approval: ApprovalRequest, operator, *, approved: bool, digest: str, note: str
) -> ActionResult:
    facts = RunFacts.of(approval)
    if facts is None:
        return _GONE
    if approval.kind != WaitKind.APPROVAL:
        return _NOT_AN_APPROVAL
    # Judged first without locks (most refusals end here); a denial
    # executes nothing, so the approver role in the run's team is enough.
    if approved:
        refused = _approval_refused(approval, operator, facts)
    else:
        refused = may_decide_in(operator, facts.team)
    if refused is not None:
        return refused
    by_submitter = facts.is_submitter(operator)
    word = "approved" if approved else "denied"
    with transaction.atomic():
        if approved:
            # Judged again under the locks of what it read: a team admin
            # taking the tool away, or the approver's removal, committed
            # since the check above is seen here, and one not yet committed
            # waits for this decision.
            facts = facts.held_still(operator)
            refused = _approval_refused(approval, operator, facts)
            if refused is not None:
                return refused
        decided = transitions.decide_approval(
            approval.pk,
            digest=digest,
            approved=approved,
            operator=operator,
            note=note,
            by_submitter=by_submitter,
        )
        if decided.outcome is DecisionOutcome.STALE:
            return _why_stale(approval.pk, digest)
        log_on_run(
            operator,
            approval.run_id,
            f"{word.title()} {approval.tool_name} at {approval.position}. {note}".strip(),
        )
        transaction.on_commit(lambda: _count(word, decided.waited_seconds))
        if decided.dispatch_count is not None:
            run_id, dispatch_count, team_id = approval.run_id, decided.dispatch_count, facts.team.pk
            transaction.on_commit(
                lambda: dispatch_or_fail(run_id, dispatch_count=dispatch_count, team_id=team_id)
            )
    if decided.outcome is DecisionOutcome.RELEASED:
        return ActionResult(True, word, f"{word}; the run goes back to the queue")
    return ActionResult(True, word, f"{word}; the run still waits for its other calls")


def edit(
    approval: ApprovalRequest, operator, *, digest: str, arguments, note: str = ""
) -> ActionResult:
    """Replace the waiting call ``approval`` names (as the editor saw it,
    ``digest``) with the same tool and ``arguments`` (G24). The edit is a
    new call: its own key and digest, waiting for its own approval — never
    the editor's under four-eyes. The editor must be able to make the write
    themselves (``may_release_write``), and the arguments must fit the
    tool's schema (``invalid_arguments``, naming each field). On success
    ``made`` is the new request."""
    facts = RunFacts.of(approval)
    if facts is None:
        return _GONE
    if approval.kind != WaitKind.APPROVAL:
        return _NOT_AN_APPROVAL
    refused = may_release_write(operator, facts.team, approval.tool_name)
    if refused is not None:
        return refused
    tool = get_registry().get(approval.tool_name)
    if tool is None:
        return ActionResult(
            False,
            "tool_gone",
            f"the tool {approval.tool_name!r} is no longer registered: its call cannot be "
            "edited; you may deny it",
        )
    if nested_deeper_than(arguments):
        return ActionResult(
            False, "invalid_arguments", f"(arguments): nested more than {MAX_JSON_DEPTH} levels"
        )
    arguments = as_journaled(arguments)
    problems = argument_errors(tool.parameters, arguments) if tool.parameters else []
    if not isinstance(arguments, dict):
        problems = ["(arguments): must be a JSON object"]
    if problems:
        return ActionResult(False, "invalid_arguments", "; ".join(problems))
    if arguments == approval.arguments:
        return ActionResult(
            False, "unchanged", "these are the call's arguments as they stand: nothing to edit"
        )
    with transaction.atomic():
        facts = facts.held_still(operator)
        refused = may_release_write(operator, facts.team, approval.tool_name)
        if refused is not None:
            return refused
        edited = transitions.edit_approval(
            approval.pk,
            digest=digest,
            arguments=arguments,
            operator=operator,
            note=note,
            timeout_seconds=settings.NRLLM_APPROVAL_TIMEOUT_SECONDS,
        ).request
        if edited is None:
            return _why_stale(approval.pk, digest)
        log_on_run(
            operator,
            approval.run_id,
            f"Edited {approval.tool_name} at {approval.position}: it waits for approval "
            f"as request {edited.pk}. {note}".strip(),
        )
        transaction.on_commit(lambda: APPROVAL_DECISIONS.labels("edited").inc())
    who = (
        "another approver"
        if settings.NRLLM_APPROVAL_SECOND_PERSON
        else "an approver (you may, too)"
    )
    return ActionResult(
        True, "edited", f"edited; the edited call waits for {who} to approve it", made=edited
    )


def log_on_run(user, run_id, message: str) -> None:
    """The admin log entry of a person's action on a run's call (G11)."""
    LogEntry.objects.log_actions(
        user.pk,
        AgentRun.objects.filter(pk=run_id),
        CHANGE,
        change_message=message,
        single_object=True,
    )


def _count(outcome: str, waited_seconds: float) -> None:
    APPROVAL_DECISIONS.labels(outcome).inc()
    APPROVAL_DECISION_SECONDS.labels(outcome).observe(waited_seconds)


def _why_stale(approval_id, digest: str) -> ActionResult:
    """Why a decision matched nothing, as the API's 409 says it."""
    approval = ApprovalRequest.objects.select_related("decided_by", "run").filter(pk=approval_id)
    approval = approval.first()
    if approval is None:
        return ActionResult(False, "not_found", "no such approval request")
    if approval.status != ApprovalStatus.PENDING:
        who = f" by {approval.decided_by.get_username()}" if approval.decided_by else ""
        return ActionResult(
            False, "already_decided", f"this call was {approval.status}{who} already"
        )
    if approval.digest != digest:
        return ActionResult(
            False,
            "stale_digest",
            "the digest is not this call's as it stands: the page was old or the run "
            "moved on; look at the call again",
        )
    if approval.run.status not in RunStatus.waiting():
        return ActionResult(False, "not_waiting", f"the run is {approval.run.status}")
    return ActionResult(False, "expired", "this request has expired")
