"""Rerun a run from a chosen model turn (G20): the admin and the API call it.

The new run is a queued run like any other. Its first steps are an
operator step naming the original and a copy of the original's journal
before the turn; its first attempt finds them and replays them as a
resumed attempt replays its journal (G12), then asks the model anew. So
the worker, the reaper and every recovery path treat it as they treat any
run, and nothing here executes a tool.

The copy is what the new run did not do itself: a copied step names the
original's step in ``replay_of`` (the run it came from is ``rerun_of``),
a copied tool step carries the idempotency key the new run would have
given that call (its journal is checked against it), and a copied model
turn carries no usage, so the new run's totals, its submitter's spend and
its budget count only what it spends.
"""

import uuid
from dataclasses import asdict, dataclass

from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.db import transaction

from runs import transitions
from runs.models import AgentRun, RunStep
from runs.models.vocabulary import StepKind
from runs.operators.rerun_verdict import RerunVerdict, rerun_verdict
from runs.queue.dispatch import dispatch_or_fail
from runs.runtime.enqueue_spend import check_spend_at_enqueue
from runs.runtime.journal import Journal
from runs.runtime.run_request import InvalidRunRequest
from runs.runtime.team_rules import under_team_rules
from teams import access
from tools.contract import idempotency_key_for

#: Who may confirm a rerun past a non-idempotent write.
PAST_WRITE_PERMISSION = "runs.rerun_past_write"
#: A model turn's meta a copy leaves out: what it cost was the original's.
_SPEND_KEYS = ("usage", "cost")


@dataclass(frozen=True)
class RerunResult:
    ok: bool
    #: The verdict's code, or ``permission`` or ``changed``.
    code: str
    detail: str
    verdict: RerunVerdict | None = None
    #: The new run, when ``ok``.
    run: AgentRun | None = None


def rerun_from(
    run: AgentRun,
    sequence: int,
    operator,
    *,
    request_data: dict | None = None,
    agent_version=...,
    note: str = "",
    confirm_past_write: bool = False,
    submitted_via: str,
) -> RerunResult:
    """Rerun ``run`` from its model turn at step ``sequence`` as a new run
    submitted by ``operator``, if the verdict allows it. ``request_data``:
    the new run's whole request (None: the original's); ``agent_version``:
    the version it comes from (omitted: the original's). Recorded on both
    runs' step streams and in the admin log (G11). Raises ``BudgetRefused``
    when the operator's budget is spent (G17), storing nothing."""
    verdict = rerun_verdict(
        run, sequence, request_data=request_data, past_write_confirmed=confirm_past_write
    )
    if not verdict.allowed:
        return RerunResult(False, verdict.code, verdict.reason, verdict)
    if verdict.past_write and not access.may(operator, PAST_WRITE_PERMISSION, run.team_id):
        return RerunResult(
            False,
            "permission",
            f"confirming a rerun past a non-idempotent write takes the permission "
            f"{PAST_WRITE_PERMISSION!r}",
            verdict,
        )
    try:
        # The team's tools and approvals as they stand now (G22).
        new_request = under_team_rules(verdict.request, run.team)
    except InvalidRunRequest as refused:
        return RerunResult(False, "team_rules", str(refused), verdict)
    # The operator is the new run's submitter: their budget pays for it,
    # and the original's team's (G21).
    check_spend_at_enqueue(new_request, operator, team_id=run.team_id)
    version = run.agent_version if agent_version is ... else agent_version
    new_id = uuid.uuid4()
    by = {"operator": operator.get_username(), "note": note, "verdict": verdict.reason}
    with transaction.atomic():
        new_run = transitions.create_rerun(
            run.pk,
            new_id,
            seen_step_count=run.step_count,
            from_sequence=sequence,
            request=new_request.as_json(),
            prompt=new_request.prompt,
            steps=[
                _step(
                    {
                        **by,
                        "action": "rerun_of",
                        "of_run": str(run.pk),
                        "from_step": sequence,
                        # What the original wrote after the step: a rerun
                        # of this run counts them as its own (G20).
                        "writes_after": [asdict(write) for write in verdict.writes_after],
                    }
                ),
                *copied_journal(run.pk, new_id, verdict.journal),
            ],
            original_step=_step({**by, "action": "rerun_from", "from_step": sequence}),
            submitted_by=operator,
            submitted_via=submitted_via,
            agent_version=version,
            # A rerun is its original's team's, whoever starts it (G22).
            team_id=run.team_id,
        )
        if new_run is None:
            return RerunResult(
                False, "changed", "the run changed since it was checked: look at it again", verdict
            )
        message = f"Rerun from step {sequence} as run {new_run.pk}. {note}".strip()
        LogEntry.objects.log_actions(
            operator.pk, [run], CHANGE, change_message=message, single_object=True
        )
        LogEntry.objects.log_actions(
            operator.pk,
            [new_run],
            ADDITION,
            change_message=f"Rerun of run {run.pk} from step {sequence}. {note}".strip(),
            single_object=True,
        )
        transaction.on_commit(
            lambda: dispatch_or_fail(
                new_run.pk, dispatch_count=new_run.dispatch_count, team_id=new_run.team_id
            )
        )
    return RerunResult(True, "rerun", f"rerun as a new run: {verdict.reason}", verdict, new_run)


def copied_journal(original_id, new_id, journal: Journal) -> list[dict]:
    """The steps of ``journal`` (a prefix of run ``original_id``'s) as the
    new run ``new_id`` records them: each model turn and tool outcome,
    naming the step it copies. A copied write's key is the one the new
    run's attempts derive for that call (its journal is checked against
    it); a copied turn leaves out what it cost."""
    sequences = [
        sequence
        for recorded in journal.turns
        for sequence in (recorded.sequence, *(outcome.sequence for outcome in recorded.outcomes))
    ]
    rows = {
        row["sequence"]: row
        for row in RunStep.objects.filter(run_id=original_id, sequence__in=sequences).values(
            "sequence", "tool_name", "effect", "arguments", "result", "error"
        )
    }
    steps = []
    for number, recorded in enumerate(journal.turns, start=1):
        turn = rows[recorded.sequence]["result"]
        steps.append(
            {
                "kind": StepKind.LLM,
                "result": {key: value for key, value in turn.items() if key not in _SPEND_KEYS},
                "replay_of": recorded.sequence,
            }
        )
        for index, outcome in enumerate(recorded.outcomes):
            row, call = rows[outcome.sequence], recorded.turn.tool_calls[index]
            planned = bool(row["effect"])  # its code ran: it has a key
            steps.append(
                {
                    "kind": StepKind.TOOL,
                    "tool_name": row["tool_name"],
                    "effect": row["effect"],
                    "arguments": row["arguments"],
                    "result": row["result"],
                    "error": row["error"],
                    "idempotency_key": idempotency_key_for(
                        str(new_id), f"{number}.{index}", call.name, call.arguments
                    )
                    if planned
                    else "",
                    "replay_of": outcome.sequence,
                }
            )
    return steps


def _step(result: dict) -> dict:
    return {"kind": StepKind.OPERATOR, "result": result}
