"""Whether a schedule's runs left a question only an operator can answer
(G23): a write in doubt not yet reconciled, or a dead letter not yet
resolved for a write interrupted or an error not worth retrying. A schedule
never fires over one: it pauses itself, and resuming it is refused until
the question is answered."""

from runs.models import AgentRun, DeadLetter
from runs.models.selectors import writes_in_doubt
from runs.models.vocabulary import DeadLetterReason, RunStatus

#: The dead letters that pause a schedule until they are resolved.
PAUSING_LETTERS = (
    DeadLetterReason.WRITE_INTERRUPTED,
    DeadLetterReason.NOT_RETRYABLE,
    DeadLetterReason.JOURNAL_UNREPLAYABLE,
)


def open_question(schedule_id) -> tuple[AgentRun, str] | None:
    """A run of the schedule with an open question, and the question in
    words (None: none). The run that ended first is named."""
    fired = AgentRun.objects.filter(firing__schedule_id=schedule_id)
    in_doubt = (
        writes_in_doubt(fired.filter(status__in=RunStatus.terminal()))
        .order_by("finished_at", "id")
        .first()
    )
    if in_doubt is not None:
        return in_doubt, f"run {in_doubt.pk} left a write in doubt: reconcile it, then resume"
    letter = (
        DeadLetter.objects.filter(
            run__firing__schedule_id=schedule_id,
            resolved_at__isnull=True,
            reason__in=PAUSING_LETTERS,
        )
        .select_related("run")
        .order_by("created_at", "id")
        .first()
    )
    if letter is not None:
        return letter.run, (
            f"run {letter.run_id} was dead-lettered ({letter.reason}): "
            "resolve its dead letter, then resume"
        )
    return None


def schedules_asked() -> set[int]:
    """The schedules with a run that has an open question, in two queries
    for them all (the fenced runs' and the open dead letters' partial
    indexes): what a pass asks before it looks at any schedule."""
    ended = AgentRun.objects.filter(firing__isnull=False, status__in=RunStatus.terminal())
    asked = set(writes_in_doubt(ended).values_list("firing__schedule_id", flat=True))
    asked |= set(
        DeadLetter.objects.filter(
            resolved_at__isnull=True, reason__in=PAUSING_LETTERS, run__firing__isnull=False
        ).values_list("run__firing__schedule_id", flat=True)
    )
    return asked
