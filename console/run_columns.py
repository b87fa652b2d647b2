"""The runs list's columns, sized for a laptop (issues #30, #47): at 1366 px,
with the admin's app list and the filters open, the table has about 700 px,
and a run takes two lines, two of these columns stacked in each of the
grid's (``_console_style.html``): id over status, prompt over why and last
error, submitter over model, age over spend.

So a row shows what an operator scans for — which run (an id's head), what
it was asked (the prompt's start), where it stands and why (status with its
reason, failure class and a write in doubt), how old, how long it ran, what
it spent and its last error — and the rest (fence, lease, mode, requeues)
is on the run's page. Every column reads the run's own row (and the
reconciliations the list prefetches): no query per row. Text a model, a
tool or a submitter wrote goes through ``format_html``: escaped.
"""

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html

from console.display import cut, moment, short_id, span
from runs.models import AgentRun
from runs.models.selectors import is_write_in_doubt
from runs.models.vocabulary import RunStatus

#: The prompt and the last error in a row (a wide screen shows them; a
#: laptop cuts them at the column's edge); the tooltip holds more.
PROMPT_CHARS = 100
ERROR_CHARS = 160
TOOLTIP_CHARS = 600


class RunListColumns:
    """Columns of ``AgentRunAdmin``'s list."""

    @admin.display(description="run")
    def run_id_shown(self, run: AgentRun):
        # The list links this column to the run's page.
        return format_html('<code class="run-id" title="{}">{}</code>', run.pk, short_id(run.pk))

    @admin.display(description="prompt")
    def prompt_shown(self, run: AgentRun):
        # dir="auto": a prompt written right to left (Arabic, Hebrew) is laid
        # out from the right, its start shown and its end cut, as any other.
        return format_html(
            '<span class="run-prompt" dir="auto" title="{}">{}</span>',
            cut(run.prompt, TOOLTIP_CHARS),
            cut(run.prompt, PROMPT_CHARS),
        )

    @admin.display(description="status", ordering="status")
    def status_shown(self, run: AgentRun):
        """The badge alone, so that the column stays narrow and in view; why
        is in the next column (and in the badge's tooltip)."""
        label = run.get_status_display().lower()
        return format_html(
            '<span class="run-status status-{}" title="{}">{}</span>',
            run.status,
            " · ".join(part for part in (label, why_so(run)) if part),
            # "waiting for approval" (or "for input") whole would widen the
            # column for one status: its colour and the reason beside tell which.
            "waiting" if run.status in RunStatus.waiting() else label,
        )

    @admin.display(description="by", ordering="submitted_by__username")
    def submitter_shown(self, run: AgentRun):
        """Who submitted the run; how, for a run nobody did (the command line)."""
        if run.submitted_by_id is None:
            # Nobody: the command line (or a row older than submitters).
            via = run.get_submitted_via_display().lower() or "unknown"
            return format_html('<span class="run-by" title="no user: {}">-</span>', via)
        name = run.submitted_by.get_username()
        return format_html('<span class="run-by" title="{}">{}</span>', name, name)

    @admin.display(description="model")
    def model_shown(self, run: AgentRun):
        """The agent version the run started from (G18), or else the model
        its request asked for (the provider's kind when it named none)."""
        model = requested_model(run)
        if run.agent_version_id is None:
            return format_html(
                '<span class="run-model" title="{}"><span class="model-name">{}</span></span>',
                model,
                model,
            )
        version = run.agent_version
        return format_html(
            '<span class="run-model run-agent" title="agent {} version {}, model {}">'
            '<span class="model-name">{}</span> <span class="model-version">v{}</span></span>',
            version.agent.name,
            version.number,
            model,
            version.agent.name,
            version.number,
        )

    @admin.display(description="age", ordering="created_at")
    def age(self, run: AgentRun):
        """How old the run is (the moment in the tooltip) and beside it how
        long its last attempt ran: one narrow column, one line (cut with "…"
        where a running run's "so far" does not fit; both whole in the tooltip)."""
        ran = ran_for(run, units=1)
        created = f"created {moment(run.created_at)}"
        return format_html(
            '<span class="run-age" title="{}"><span title="{}">{}</span>{}</span>',
            f"{created}; the last attempt ran {ran}" if ran else created,
            created,
            span(timezone.now() - run.created_at, units=1),
            format_html(
                ' · <small class="run-ran" title="the last attempt ran {}, from its claim to '
                'its end">{}</small>',
                ran,
                ran,
            )
            if ran
            else "",
        )

    @admin.display(description="why · last error")
    def last_error(self, run: AgentRun):
        """The status's reason and the run's last error on one line (under
        the prompt), cut with "…" at the column's edge; both whole in the
        tooltip. The line shows the error's message: its class name
        (``AuditPersistenceFailed``) says nothing more to an operator
        triaging, and cut at the edge it was a word broken off; the
        tooltip and the run's page keep it."""
        why, error = why_so(run), error_text(run)
        if not (why or error):
            return None
        said = run.error_message or run.error_type
        return format_html(
            '<span class="why-line" title="{}">{}{}{}</span>',
            " — ".join(part for part in (why, cut(error, TOOLTIP_CHARS)) if part),
            format_html('<small class="run-why">{}</small>', why) if why else "",
            format_html('<span class="why-sep">{}</span>', " — ") if why and said else "",
            # dir="auto": an error written right to left starts at the right
            # of what the line leaves it, and is cut at its left.
            format_html('<span class="run-error" dir="auto">{}</span>', cut(said, ERROR_CHARS))
            if said
            else "",
        )


def requested_model(run: AgentRun) -> str:
    """The model the run's request asked its provider for, or the
    provider's kind ("scripted") when it named none; "-" for neither."""
    provider = run.request.get("provider") if isinstance(run.request, dict) else None
    if not isinstance(provider, dict):
        return "-"
    return str(provider.get("model") or provider.get("kind") or "-")


def why_so(run: AgentRun) -> str:
    """The status's reason in a few words: the termination reason and failure
    class of an ended run, a write in doubt, a retry's cause, a lease gone."""
    parts = []
    if run.status in RunStatus.terminal():
        # "completed" twice says nothing: the reason only when it is news.
        reason = "" if run.termination_reason == run.status else run.termination_reason
        parts = [reason, run.failure_class]
        if is_write_in_doubt(run):
            parts.append("write in doubt")
    elif run.status == RunStatus.QUEUED and run.failure_class:
        parts = [f"retry after {run.failure_class}"]
    elif run.status == RunStatus.WAITING_FOR_INPUT:
        # Which of the two, and what is asked, is on its page and the inbox.
        parts = ["for an answer or another system's completion"]
    elif run.status == RunStatus.RUNNING:
        if run.cancel_requested_at:
            parts = ["cancel requested"]
        elif run.lease_expires_at and run.lease_expires_at < timezone.now():
            parts = ["lease expired"]
    return " · ".join(part for part in parts if part)


def ran_for(run: AgentRun, *, units: int = 2) -> str:
    """How long the run has run: from its first claim to its end (or now),
    in ``units`` units at most (``span``)."""
    if run.started_at is None:
        return ""
    if run.finished_at is None:
        if run.status != RunStatus.RUNNING:
            return ""  # waiting, or queued again: it is not running now
        return f"{span(timezone.now() - run.started_at, units=units)} so far"
    return span(run.finished_at - run.started_at, units=units)


def error_text(run: AgentRun) -> str:
    """The run's last error as ``type: message``; "" for none."""
    return ": ".join(part for part in (run.error_type, run.error_message) if part)
