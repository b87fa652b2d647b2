"""What happens to a queued run after a failed attempt (G3, G8)."""

from dataclasses import dataclass

from runs.models.vocabulary import DeadLetterReason
from runs.providers.failures import is_retryable
from tools.effects import ToolEffect


@dataclass(frozen=True)
class RetryDecision:
    requeue: bool
    #: Why the run is dead-lettered, when it is not requeued.
    dead_letter_reason: str = ""
    delay_seconds: float = 0


def decide_retry(
    *,
    failure_class: str,
    pending_effect: str,
    requeue_count: int,
    max_requeues: int,
    retry_after: float | None = None,
    backoff_base: float = 2,
    backoff_cap: float = 300,
) -> RetryDecision:
    """Requeue with backoff, or dead-letter and say why.

    A fence standing on a non-idempotent write means the write may have
    landed: never retried, whatever the class (a non-retryable class keeps
    its own reason, ``not_retryable``, as G3 asks of a failed write audit).
    """
    if not is_retryable(failure_class):
        return RetryDecision(False, DeadLetterReason.NOT_RETRYABLE)
    if pending_effect == ToolEffect.NON_IDEMPOTENT_WRITE:
        return RetryDecision(False, DeadLetterReason.WRITE_INTERRUPTED)
    if requeue_count >= max_requeues:
        return RetryDecision(False, DeadLetterReason.RETRIES_EXHAUSTED)
    backoff = min(backoff_cap, backoff_base * 2**requeue_count)
    if retry_after is not None:
        # The provider said when to come back; never sooner, within the cap.
        backoff = max(backoff, min(retry_after, backoff_cap))
    return RetryDecision(True, delay_seconds=backoff)
