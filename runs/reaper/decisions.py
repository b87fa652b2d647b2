"""What the reaper does with a run whose lease expired, and why (G7).

``decide_reap`` is the decision alone, from the run's fence and counters:
no database, no clock. The pass (``runs.reaper.passes``) applies it through
a transition that re-checks staleness in its UPDATE.
"""

from dataclasses import dataclass

from runs.models.vocabulary import DeadLetterReason, TerminationReason
from tools.effects import ToolEffect

REQUEUE = "requeued"
DEAD_LETTER = "dead_lettered"
CANCEL = "cancelled"
ABANDON = "abandoned"
REDISPATCH = "redispatched"
EXPIRE = "approval_expired"
#: A question or a deferred call waited past its expiry (G24).
EXPIRE_INPUT = "input_expired"


@dataclass(frozen=True)
class ReapDecision:
    action: str
    reason: str


def decide_reap(
    *,
    pending_effect: str,
    audit_failed: bool = False,
    interactive: bool = False,
    requeue_count: int,
    max_requeues: int,
    cancel_requested: bool,
) -> ReapDecision:
    """What to do with a run whose lease expired, and why."""
    if pending_effect == ToolEffect.NON_IDEMPOTENT_WRITE:
        # The write may have landed; running it again could repeat it.
        return ReapDecision(DEAD_LETTER, DeadLetterReason.WRITE_INTERRUPTED)
    if cancel_requested:
        return ReapDecision(CANCEL, "cancel requested")
    if interactive:
        # Its caller is gone (killed, interrupted): no worker may finish
        # what the caller started, and perhaps stopped on purpose.
        return ReapDecision(ABANDON, TerminationReason.ABANDONED)
    if audit_failed:
        # A write executed and its step could not be recorded (G3): its
        # settle failed too, and a retry would run it again.
        return ReapDecision(DEAD_LETTER, DeadLetterReason.NOT_RETRYABLE)
    if requeue_count >= max_requeues:
        return ReapDecision(DEAD_LETTER, DeadLetterReason.RETRIES_EXHAUSTED)
    return ReapDecision(REQUEUE, "lease expired; safe to run again")
