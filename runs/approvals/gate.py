"""The approval gate: what one attempt does with a turn's calls that need an
operator's decision (G14).

A call that needs approval is asked for by a turn; the run waits, and an
operator decides each waiting call on its own (one decision per call, not
per turn), carrying the call's digest (``runs.transitions.approvals.digest``,
written with the request when the run parks).

An attempt that resumes the turn (``Decisions``) executes an approved call
as it was approved — the journal's turn, never one asked again — and tells
the model of a denied one instead of running it. A call a person edited
(G24) executes with the arguments that were approved, under their key, and
the model is told so in its result.
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from runs.models import ApprovalRequest
from runs.models.vocabulary import ApprovalStatus
from runs.transitions import WaitingCall
from tools.contract import idempotency_key_for


def denial_message(operator_name: str, note: str) -> str:
    """What the model is told as the result of a call an operator denied."""
    message = f"not executed: an operator ({operator_name}) denied this call"
    return f"{message}; their note: {note}" if note else message


@dataclass(frozen=True)
class Decision:
    approved: bool
    #: The key of the call as the model asked for it (an edit's request
    #: holds its own besides).
    idempotency_key: str
    #: For a denial, what the model is told.
    message: str = ""
    #: An approved edit: the arguments it runs with, and who edited them.
    edited_arguments: object = None
    edited_by: str = ""


class Decisions:
    """The decided calls of one turn of a run, by place. A decision counts
    only for the call it was made for: same place and idempotency key (the
    key hashes the tool and its arguments)."""

    def __init__(self, turn_sequence: int | None = None, by_position: dict | None = None):
        self.turn_sequence = turn_sequence
        self._by_position: dict[str, Decision] = by_position or {}

    @classmethod
    def of_turn(cls, run_id, turn_sequence: int) -> "Decisions":
        rows = ApprovalRequest.objects.filter(
            run_id=run_id,
            turn_sequence=turn_sequence,
            status__in=[ApprovalStatus.APPROVED, ApprovalStatus.DENIED],
        ).values_list(
            "position",
            "status",
            "idempotency_key",
            "asked_key",
            "note",
            "decided_by__username",
            "replaces_id",
            "arguments",
            "edited_by__username",
        )
        decisions = {}
        for position, status, key, asked, note, who, replaces, arguments, editor in rows:
            approved = status == ApprovalStatus.APPROVED
            decisions[position] = Decision(
                approved,
                asked or key,
                "" if approved else denial_message(who or "?", note),
                edited_arguments=arguments if replaces is not None and approved else None,
                edited_by=(editor or "?") if replaces is not None else "",
            )
        return cls(turn_sequence, decisions)

    def for_call(self, turn_sequence: int | None, position: str, key: str) -> Decision | None:
        if turn_sequence is None or turn_sequence != self.turn_sequence:
            return None
        decision = self._by_position.get(position)
        if decision is None or decision.idempotency_key != key:
            return None
        return decision


class ApprovalGate:
    """What one attempt needs to gate a turn's calls: which tools wait for
    approval (by policy, or because the run's request asked) and the
    decisions already made for the turn it resumes. Reads nothing: the
    claim read the policy, the runtime the decisions."""

    def __init__(
        self,
        run_id,
        *,
        by_policy: frozenset[str] = frozenset(),
        by_request: frozenset[str] = frozenset(),
        decisions: Decisions | None = None,
    ):
        self.run_id = str(run_id)
        self.by_policy = by_policy
        self.by_request = by_request
        self.decisions = decisions or Decisions()

    def review(self, calls: Sequence, turn_sequence: int | None) -> tuple[dict, list]:
        """For ``calls`` (``PlannedCall``s of one turn): the ones not to run
        as asked (position → what the model is told of a denied call, or
        the ``PlannedCall`` an approved edit runs instead) and the ones that
        wait (``WaitingCall``s). A call decided for this turn is never asked
        again: approved, it runs (as edited, if it was); denied, it does not.
        A tool that never needs approval (``ask_person``) never waits."""
        if not (self.by_policy or self.by_request or self.decisions.turn_sequence):
            return {}, []  # the common case: nothing needs approval
        denied, waiting = {}, []
        for call in calls:
            name = call.tool.name
            key = idempotency_key_for(self.run_id, call.position, name, call.arguments)
            decision = self.decisions.for_call(turn_sequence, call.position, key)
            if decision is not None:
                if not decision.approved:
                    denied[call.position] = decision.message
                elif decision.edited_arguments is not None:
                    denied[call.position] = dataclasses.replace(
                        call,
                        arguments=decision.edited_arguments,
                        edited_by=decision.edited_by,
                    )
                continue
            if getattr(call.tool, "never_needs_approval", False):
                continue
            if name in self.by_policy or name in self.by_request:
                waiting.append(
                    WaitingCall(
                        position=call.position,
                        tool_name=name,
                        effect=call.tool.effect.value,
                        arguments=call.arguments,
                        idempotency_key=key,
                        required_by="policy" if name in self.by_policy else "request",
                    )
                )
        return denied, waiting
