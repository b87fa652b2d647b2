"""What an operator reads of a write in doubt (G10, G13), wherever the
console shows one — a run's page, the failed write audits, a dead letter,
the reconcile form, the overview's count: in words, which tool and which
call (its arguments summarised), its idempotency key, why nobody knows
whether it took effect, where to check (the tool's own record, which the
tool may point to: ``tools.contract.Tool.where_to_check``, linked where it
gives a link) and what each way of reconciling it leads to. An error's
class (``AuditPersistenceFailed``) is not the words: pages keep it in a
tooltip.

Everything here is text for templates, which escape it: a call's arguments
came from a model, a tool's record from the tool."""

import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

from console.display import as_text, cut
from runs.models import AgentRun
from runs.models.selectors import is_write_in_doubt, needs_reconciling
from runs.models.vocabulary import RunStatus, StepKind, TerminationReason
from tools.contract import WhereToCheck
from tools.effects import ToolEffect
from tools.registry import get_registry

logger = logging.getLogger(__name__)

#: A call's arguments, summarised: so many, each cut to so many characters
#: (all of them, whole, are on the run's page).
ARGUMENTS_SHOWN = 4
ARGUMENT_CHARS = 80
#: What the write returned after its run stopped counting on it.
LATE_RESULT_CHARS = 300

EFFECT_WORDS = {
    ToolEffect.NON_IDEMPOTENT_WRITE: "a non-idempotent write: running it again could repeat it",
    ToolEffect.IDEMPOTENT_WRITE: "an idempotent write: the same call again changes nothing more",
}

#: Why the outcome is not known, by the error the run ended with: a
#: sentence for a page and a few words for a table's cell.
WHY_BY_ERROR = {
    "AuditPersistenceFailed": (
        "It ran, but its record could not be saved to the database, so what it did is not "
        "known; the run stopped there rather than go on without it.",
        "ran; its record could not be saved",
    ),
    "WriteOutcomeUnknown": (
        "It could not tell whether its write took effect — it timed out, its connection "
        "broke after the request may have left, or it was stopped at its time limit — and "
        "the run stopped there.",
        "could not tell whether it took effect",
    ),
    "WriteNotDurable": (
        "It ran, but the database lost its record (or the steps before it), as after a "
        "failover, and the run stopped there.",
        "ran; the database lost its record",
    ),
    "LeaseExpired": (
        "The worker running it stopped during the call (killed, or cut off), so its outcome "
        "was never recorded.",
        "its worker stopped during the call",
    ),
}
UNREPLAYABLE = (
    "The run's journal could not be replayed, and this call's outcome is not in it: it may "
    "have run.",
    "its outcome is not in the journal",
)
UNRECORDED = ("Its outcome was never recorded.", "its outcome was never recorded")
TURN_GONE = (
    " A requeue would not run it again with the same idempotency key: the model turn that "
    "asked for it is gone."
)

IF_APPLIED = "applied if it landed (then nothing runs it again)"
IF_NOT_APPLIED = "not_applied if it did not (then a requeue may run it again)"


@dataclass(frozen=True)
class WriteInQuestion:
    """The write on an ended run's fence, as an operator reads it."""

    tool: str
    effect: str
    #: What the effect means for a repeat.
    effect_words: str
    #: ``(name, value)`` of its first arguments, each cut; ``more`` not shown.
    arguments: list[tuple[str, str]]
    more_arguments: int
    idempotency_key: str
    #: Why its outcome is not known: a sentence, and a few words.
    why: str
    why_short: str
    #: The error's class and message, for a tooltip.
    error: str
    #: Whether it is still a question for an operator (``runs.models.selectors``):
    #: not reconciled, nor settled by running it again with its key.
    in_doubt: bool
    #: Where to check, in words, and a link to the record ("" for none).
    check: str
    check_url: str = ""
    #: What it returned after its time limit (a ``late_result`` step).
    late_result: dict | None = None
    if_applied: str = IF_APPLIED
    if_not_applied: str = IF_NOT_APPLIED


def described_write(run: AgentRun, *, with_late_result: bool = True) -> WriteInQuestion | None:
    """The write standing on ``run``'s fence, in words; None when no write
    is in question (no fence). Asks the database what ``is_write_in_doubt``
    asks, and, ``with_late_result``, for the write's late result (a list
    of runs leaves it out: one query a row)."""
    call = run.pending_call or {}
    if not run.pending_effect or not isinstance(call, dict):
        return None
    tool = str(call.get("tool") or "an unnamed tool")
    arguments = call.get("arguments")
    key = str(call.get("idempotency_key") or "")
    why, why_short = _why(run)
    check, check_url = where_to_check(tool, arguments, key)
    shown = _summarised(arguments)
    return WriteInQuestion(
        tool=tool,
        effect=run.pending_effect,
        effect_words=EFFECT_WORDS.get(run.pending_effect, run.pending_effect),
        arguments=shown,
        more_arguments=max(0, len(arguments) - len(shown)) if isinstance(arguments, dict) else 0,
        idempotency_key=key,
        why=why,
        why_short=why_short,
        error=": ".join(part for part in (run.error_type, run.error_message) if part),
        in_doubt=is_write_in_doubt(run),
        check=check,
        check_url=check_url,
        late_result=late_result(run) if with_late_result else None,
    )


def _why(run: AgentRun) -> tuple[str, str]:
    if run.status not in RunStatus.terminal():
        return ("The run has not ended: the write is under way.", "under way")
    if run.termination_reason == TerminationReason.JOURNAL_UNREPLAYABLE:
        why, short = UNREPLAYABLE
    else:
        why, short = WHY_BY_ERROR.get(run.error_type, UNRECORDED)
    if run.pending_effect == ToolEffect.IDEMPOTENT_WRITE and needs_reconciling(run):
        why += TURN_GONE
    return why, short


def _summarised(arguments) -> list[tuple[str, str]]:
    """A call's first arguments, each cut to a line: what tells the call
    apart (the recipient, the slug), not all of it."""
    if isinstance(arguments, dict):
        return [
            (str(name), cut(as_text(value), ARGUMENT_CHARS))
            for name, value in list(arguments.items())[:ARGUMENTS_SHOWN]
        ]
    if arguments in (None, "", [], {}):
        return []
    return [("", cut(as_text(arguments), ARGUMENT_CHARS))]


def where_to_check(tool_name: str, arguments, idempotency_key: str) -> tuple[str, str]:
    """Where an operator checks whether the call took effect: the tool's
    own word (``Tool.where_to_check``) and its link if it is one a page may
    carry, else the words every write tool shares. An MCP server's tool is
    not asked: drawing a page asks no server anything."""
    registry = get_registry()
    tool = None if registry.toolset_of(tool_name) else registry.get(tool_name)
    record = None
    if tool is not None:
        try:
            record = tool.where_to_check(arguments, idempotency_key)
        except Exception:  # the tool author's code: the page is drawn anyway
            logger.exception("where_to_check of tool %r failed", tool_name)
    if not isinstance(record, WhereToCheck) or not str(record.text).strip():
        if record is not None and not isinstance(record, WhereToCheck):
            # Its author's slip (a string, say): the page is drawn anyway.
            logger.error(
                "where_to_check of tool %r answered a %s, not a WhereToCheck",
                tool_name,
                type(record).__name__,
            )
        return (
            f"where {tool_name} writes: look there for this call's effect (and for the "
            "idempotency key, if the tool sends it along)",
            "",
        )
    return str(record.text), safe_link(str(record.url or ""))


def safe_link(url: str) -> str:
    """``url`` if a page may link it: ``http(s)://…`` or a path on this site;
    "" for anything else (``javascript:``, ``//elsewhere``, a malformed URL)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    if parts.scheme in ("http", "https") and parts.netloc:
        return url
    if not parts.scheme and not parts.netloc and url.startswith("/") and "\\" not in url:
        return url
    return ""


def late_result(run: AgentRun) -> dict | None:
    """What the write in question returned after its run had stopped
    counting on it (a ``late_result`` step, G15): the operator who
    reconciles it reads it where they decide. None if it never returned."""
    key = (run.pending_call or {}).get("idempotency_key")
    if not key:
        return None
    step = (
        run.steps.filter(kind=StepKind.LATE_RESULT, idempotency_key=key)
        .order_by("-sequence")
        .first()
    )
    if step is None:
        return None
    return {
        "sequence": step.sequence,
        "error": step.error,
        "outcome": cut(step.error or as_text(step.result), LATE_RESULT_CHARS),
    }
