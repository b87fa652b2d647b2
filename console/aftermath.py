"""What a run did after an operator acted on it (issue #30, "say what an
action did"): read from the record, never predicted.

An action's own answer says what it will do ("resumes after step 3 …");
what the run then did depends on who executes it and when: the worker may
have run it to its end before the admin's redirect lands, or RQ may not
have handed it to one yet. So both the message after an action and the run
page tell the run's story since the action's step as the database holds it
at that moment: the steps after it, the run's status and error, the dead
letters it opened since and the calls it waits for, each linked.

Text a model, a tool or a provider produced is escaped (``format_html``).
"""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Q
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from console.display import clock, cut, position_in_words, short_id
from runs.models import AgentRun, RunStep
from runs.models.vocabulary import ApprovalStatus, RunStatus, StepKind, WaitKind

#: Operator actions after which the run moves (reconcile and dismiss leave
#: it where it is: their message says what they changed).
MOVING_ACTIONS = ("requeue", "restart", "cancel")
DECISIONS = ("approved", "denied")
ERROR_CHARS = 240


@dataclass(frozen=True)
class Since:
    """An operator's last action on a run and what the run did after it."""

    #: "requeue", "restart", "cancel", "approval"/"denial" of a call, or
    #: "answer" to the agent's question.
    action: str
    #: The call decided, in words ("call 1 of turn 3 (send_notification)").
    call: str
    operator: str
    at: datetime
    story: SafeString

    def heading(self, user) -> SafeString:
        """ "Since your requeue at 16:45:37 UTC" (or "olivia's")."""
        whose = "your" if user.get_username() == self.operator else f"{self.operator}'s"
        what = f"{self.action} of {self.call}" if self.call else self.action
        return format_html("Since {} {} at {}", whose, what, clock(self.at))


def last_action(run: AgentRun) -> RunStep | None:
    """The run's latest step of an operator action that moves it: a requeue,
    restart or cancel, an approval decision, or an answer to its question."""
    return (
        run.steps.filter(
            Q(kind=StepKind.OPERATOR, result__action__in=MOVING_ACTIONS)
            | Q(kind=StepKind.APPROVAL, result__action__in=DECISIONS)
            | Q(kind=StepKind.INPUT, result__action="answered")
        )
        .order_by("-sequence")
        .first()
    )


def since_last_action(run: AgentRun, *, with_error: bool = True) -> Since | None:
    """The run's story since its last moving action (None: no such action).
    Without ``with_error`` it leaves the run's error out (the run's page
    shows it right above: issue #41, the error once)."""
    step = last_action(run)
    return None if step is None else since(run, step, with_error=with_error)


def since(run: AgentRun, step: RunStep, *, with_error: bool = True) -> Since:
    """What ``run`` (as read now) did after ``step``, an operator's step."""
    result = step.result or {}
    action = result.get("action", "")
    call = ""
    if step.kind == StepKind.APPROVAL:
        call = f"{position_in_words(result.get('position', '?'))} ({step.tool_name})"
        action = "approval" if action == "approved" else "denial"
    if step.kind == StepKind.INPUT:
        call = f"{position_in_words(result.get('position', '?'))} ({step.tool_name})"
        action = "answer"
        # The answer is recorded with its call's outcome, the step after:
        # that is no call the run made since.
        step = answered_call(run, step)
    again = result.get("previous") == RunStatus.FAILED
    return Since(
        action=action,
        call=call,
        operator=result.get("operator") or "?",
        at=step.created_at,
        story=story(run, step, again=again, with_error=with_error),
    )


def answered_call(run: AgentRun, input_step: RunStep) -> RunStep:
    """The tool step recorded with an answer's input step (the next one),
    or the input step itself if there is none."""
    return run.steps.filter(sequence=input_step.sequence + 1).first() or input_step


def story(
    run: AgentRun, step: RunStep, *, again: bool = False, with_error: bool = True
) -> SafeString:
    """The run since ``step`` in a sentence: where it stands, what it did
    (its error, ``with_error``), the dead letters it opened and the calls
    it waits for, linked."""
    error_chars = ERROR_CHARS if with_error else 0
    done = run.steps.filter(sequence__gt=step.sequence).aggregate(
        turns=Count("pk", filter=Q(kind=StepKind.LLM)),
        tools=Count("pk", filter=Q(kind=StepKind.TOOL)),
    )
    work = _calls(done["turns"], done["tools"])
    status = run.status
    if status == RunStatus.QUEUED:
        if run.failure_class:
            told = format_html(
                "its attempt failed ({}{}) and it is queued for a retry",
                run.failure_class,
                _error(run.error_message, error_chars),
            )
        elif done["turns"] or done["tools"]:
            told = format_html("it made {}, and is queued again", work)
        else:
            told = "it is queued: no worker has taken it yet"
    elif status == RunStatus.RUNNING:
        told = format_html("it is running: {} so far", work or "no model call yet")
    elif status == RunStatus.WAITING_FOR_APPROVAL:
        told = _waiting(run, work)
    elif status == RunStatus.WAITING_FOR_INPUT:
        told = _waiting_for_input(run, work)
    elif status == RunStatus.COMPLETED:
        told = format_html("it made {}, and completed", work) if work else "it completed"
    elif status == RunStatus.FAILED:
        told = _failed(run, work, again=again, error_chars=error_chars)
    else:
        told = format_html("it made {}, and was cancelled", work) if work else "it was cancelled"
    # Every open dead letter was opened since: a requeue or restart resolves
    # them, and nothing else moves a run that has one (whatever the clocks
    # of the web server and the worker say); resolved ones, by the clock.
    opened = list(
        run.dead_letters.filter(
            Q(resolved_at__isnull=True) | Q(created_at__gte=step.created_at)
        ).order_by("pk")
    )
    if opened:
        links = format_html_join(
            ", ",
            '<a href="{}" class="opened-dead-letter">dead letter #{}</a>',
            (
                (reverse("admin:runs_deadletter_change", args=[dead_letter.pk]), dead_letter.pk)
                for dead_letter in opened
            ),
        )
        told = format_html("{}, and opened {}", told, links)
    return format_html("{}.", told)


def _calls(turns: int, tools: int) -> str:
    """How many model and tool calls: "2 model calls and 1 tool call" ("")."""
    parts = []
    if turns:
        parts.append(f"{turns} model call{'' if turns == 1 else 's'}")
    if tools:
        parts.append(f"{tools} tool call{'' if tools == 1 else 's'}")
    return " and ".join(parts)


def _error(error: str, chars: int) -> str:
    """ ": the error" cut to ``chars``; "" for no error or no characters."""
    return f": {cut(error, chars)}" if error and chars else ""


def _failed(run: AgentRun, work: str, *, again: bool, error_chars: int) -> SafeString:
    """ "it failed again at its model call (auth): …", or "it made 2 model
    calls, then failed (…)"."""
    failed = f"made {work}, then failed" if work else "failed"
    if again:
        failed += " again"
    if run.error_type == "ProviderError":
        return format_html(
            "it {} at {} model call ({}){}",
            failed,
            "its next" if work else "its",
            run.failure_class or "unknown",
            _error(run.error_message, error_chars),
        )
    why = " · ".join(part for part in (run.termination_reason, run.failure_class) if part)
    error = ": ".join(part for part in (run.error_type, run.error_message) if part)
    return format_html(
        "it {} ({}){}", failed, why or "no reason recorded", _error(error, error_chars)
    )


def _waiting(run: AgentRun, work: str) -> SafeString:
    pending = run.approvals.filter(status=ApprovalStatus.PENDING).order_by("position")
    calls = ", ".join(f"{position_in_words(p.position)} ({p.tool_name})" for p in pending)
    inbox = f"{reverse('admin:runs_approvals')}?run={run.pk}"
    return format_html(
        'it {}waits for approval of {} — <a href="{}" class="decide-link">decide</a>',
        f"made {work}, and " if work else "",
        calls or "its calls",
        inbox,
    )


def _waiting_for_input(run: AgentRun, work: str) -> SafeString:
    """ "it waits for an answer to its question — answer it", or for
    another system to complete a deferred call (nothing to do here)."""
    waiting = run.approvals.filter(status=ApprovalStatus.PENDING).order_by("position").first()
    made = f"made {work}, and " if work else ""
    inbox = f"{reverse('admin:runs_approvals')}?run={run.pk}"
    if waiting is not None and waiting.kind == WaitKind.DEFERRED:
        reference = f" ({waiting.reference})" if waiting.reference else ""
        return format_html(
            'it {}waits for another system to complete {}{} — <a href="{}" '
            'class="inbox-link">see it</a>',
            made,
            waiting.tool_name,
            reference,
            inbox,
        )
    return format_html(
        'it {}waits for an answer to its question — <a href="{}" class="answer-link">answer it</a>',
        made,
        inbox,
    )


# --- the message after an action ----------------------------------------------------

#: What each moving action did, as a message's first words.
_DONE = {"requeue": "Requeued", "restart": "Restarted", "cancel": "Cancel requested"}


def after_action(run_id, action: str, detail: str, *, with_run: bool = False) -> SafeString:
    """The message after ``action`` (``requeue``, ``restart``, ``cancel``)
    succeeded on the run: what was done, when, and what the run did since,
    as read now (``with_run``: named and linked, for a list's messages).
    It begins with a word of ours: the admin capitalises a message's first
    letter, and a tool's name must stay as it is."""
    run = AgentRun.objects.filter(pk=run_id).first()
    step = last_action(run) if run is not None else None
    result = (step.result or {}) if step is not None else {}
    done = _DONE[action]
    if result.get("action") == "cancel" and result.get("outcome") == "cancelled":
        done = "Cancelled"
    if with_run:
        done = done.lower()  # after "Run 1a2b3c4d: "
    if step is None or result.get("action") != action:
        # Gone, or someone acted after: say only what this action said.
        told = format_html("{}: {}.", done, detail)
    elif done.lower() == "cancelled":
        # Queued or waiting: it ended there and then; nothing follows.
        told = format_html("{} at {}: it will not run.", done, clock(step.created_at))
    else:
        told = format_html(
            "{} at {}: {}. Since then {}",
            done,
            clock(step.created_at),
            result.get("verdict") or detail.removeprefix("cancel requested: "),
            story(run, step, again=result.get("previous") == RunStatus.FAILED),
        )
    return format_html("{}{}", run_named(run_id) if with_run else "", told)


def after_decision(approval, detail: str) -> SafeString:
    """The message after a call was approved or denied: the call, what the
    decision did, and what the run did since, as read now."""
    what = format_html(
        "Call {} ({}) of run {}: {}.",
        position_in_words(approval.position).removeprefix("call "),
        approval.tool_name,
        run_named(approval.run_id, colon=False),
        detail,
    )
    run = AgentRun.objects.filter(pk=approval.run_id).first()
    step = last_action(run) if run is not None else None
    if step is None or (step.result or {}).get("approval") != approval.pk:
        return what
    return format_html("{} Since then {}", what, story(run, step))


def after_answer(question, detail: str) -> SafeString:
    """The message after the agent's question was answered: the run, what
    the answer did, and what the run did since, as read now."""
    what = format_html(
        "The question of run {} ({}): {}.",
        run_named(question.run_id, colon=False),
        position_in_words(question.position),
        detail,
    )
    run = AgentRun.objects.filter(pk=question.run_id).first()
    step = last_action(run) if run is not None else None
    if step is None or (step.result or {}).get("request") != question.pk:
        return what
    return format_html("{} Since then {}", what, story(run, answered_call(run, step)))


def run_named(run_id, *, colon: bool = True) -> SafeString:
    """A run's id's head, linked to its page (the whole id in the tooltip)."""
    return format_html(
        '{}<a href="{}" title="{}">{}</a>{}',
        "Run " if colon else "",
        reverse("admin:runs_agentrun_change", args=[run_id]),
        run_id,
        short_id(run_id),
        ": " if colon else "",
    )
