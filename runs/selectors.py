"""Run queries that the admin, the API and the metrics share, each backed by
an index (see ``AgentRun.Meta``)."""

from django.db import NotSupportedError, connection
from django.db.models import (
    BooleanField,
    CharField,
    Count,
    Exists,
    F,
    Func,
    OuterRef,
    Q,
    Subquery,
    Value,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce

from runs.models import AgentRun, RunStep, WriteReconciliation
from runs.vocabulary import RunStatus, StepKind, TerminationReason
from tools.contract import idempotency_key_for
from tools.effects import ToolEffect

# A *write in doubt*: a run that ended with its fence standing on a
# non-idempotent write (it may or may not have landed) that nobody has
# reconciled yet. The same predicate for a queryset and for one row; a test
# pins that they agree. A running run's fence is a write in progress, not
# in doubt. An idempotent write on the fence is in doubt too when its call
# would not run again with its key (``idempotent_writes_in_doubt``): the
# requeue verdict asks ``calls_going_live`` of one run, retention of many.


#: A tool step whose write tool's code ran (its idempotency key is set).
EXECUTED_WRITE = Q(
    kind=StepKind.TOOL,
    effect__in=[ToolEffect.IDEMPOTENT_WRITE, ToolEffect.NON_IDEMPOTENT_WRITE],
) & ~Q(idempotency_key="")


def fenced_key():
    """The idempotency key of the call a run's fence stands on, as text;
    "" for a fence stamped before calls were stamped with it."""
    return Coalesce(KT("pending_call__idempotency_key"), Value(""), output_field=CharField())


def _write_in_doubt():
    """The condition, on a queryset annotated with ``fenced_key``."""
    return Q(
        pending_effect=ToolEffect.NON_IDEMPOTENT_WRITE, status__in=RunStatus.terminal()
    ) & ~Exists(_reconciliations_of_the_fenced_write())


def _reconciliations_of_the_fenced_write():
    """A run's reconciliations of the write its fence stands on, on a
    queryset annotated with ``fenced_key``."""
    return WriteReconciliation.objects.filter(
        run=OuterRef("pk"),
        lease_token=OuterRef("lease_token"),
        idempotency_key=OuterRef("fenced_key"),
    )


def writes_in_doubt(queryset):
    """The runs of ``queryset`` with a write in doubt: no reconciliation for
    the write their fence stands on (a reconciliation settles one write)."""
    return queryset.annotate(fenced_key=fenced_key()).filter(_write_in_doubt())


def without_writes_in_doubt(queryset):
    """The runs of ``queryset`` that ``writes_in_doubt`` leaves out."""
    return queryset.annotate(fenced_key=fenced_key()).exclude(_write_in_doubt())


def calls_going_live(run_id, turn_number: int, calls, outcomes: int) -> set[str]:
    """The idempotency keys of the calls a resumed attempt runs live, each
    with its key: those of the journal's last turn (its ``turn_number``th,
    asking for ``calls``, (name, arguments) pairs) after the ``outcomes``
    it has recorded. An ``idempotent_write`` on the fence whose key is not
    among them (its turn is gone, or its outcome is recorded) would not run
    again as it ran: it is in doubt until an operator reconciles it (G10)."""
    return {
        idempotency_key_for(str(run_id), f"{turn_number}.{index}", name, arguments)
        for index, (name, arguments) in enumerate(calls)
        if index >= outcomes
    }


def idempotent_writes_in_doubt(queryset) -> list:
    """The ids of the runs of ``queryset`` that ended with their fence on an
    ``idempotent_write`` that is in doubt (``calls_going_live``) and that no
    reconciliation settles. One query over the fenced runs alone (the
    ``run_fenced_idx`` index): each one's journal's last turn and the
    outcomes recorded after it; the keys are computed here, as the
    resumed attempt computes them."""
    journal_turns = RunStep.objects.filter(
        run=OuterRef("pk"), kind=StepKind.LLM, sequence__gt=OuterRef("journal_begins_after")
    )
    last_turn = journal_turns.order_by("-sequence")
    outcomes = RunStep.objects.filter(
        run=OuterRef("pk"), kind=StepKind.TOOL, sequence__gt=OuterRef("last_turn_sequence")
    )
    rows = (
        queryset.annotate(fenced_key=fenced_key())
        .filter(pending_effect=ToolEffect.IDEMPOTENT_WRITE, status__in=RunStatus.terminal())
        .exclude(fenced_key="")
        .exclude(Exists(_reconciliations_of_the_fenced_write()))
        .annotate(
            last_turn_sequence=Subquery(last_turn.values("sequence")[:1]),
            last_turn=Subquery(last_turn.values("result")[:1]),
            turns=_counted(journal_turns),
        )
        .annotate(outcomes=_counted(outcomes))
        .values_list("pk", "fenced_key", "turns", "last_turn", "outcomes")
    )
    return [
        run_id
        for run_id, key, turns, last_turn, outcomes in rows
        if key not in calls_going_live(run_id, turns, _calls_asked(last_turn), outcomes)
    ]


def _counted(steps):
    """How many rows ``steps`` (correlated to a run) holds, as a subquery."""
    counted = steps.order_by().values("run").annotate(count=Count("pk")).values("count")
    return Coalesce(Subquery(counted), Value(0))


def _calls_asked(turn) -> list[tuple]:
    """The (name, arguments) of the calls a recorded model turn asked for;
    none from a turn not in the shape of one (its journal cannot be
    replayed: nothing runs live)."""
    try:
        return [(call["name"], call.get("arguments")) for call in turn.get("tool_calls") or []]
    except (AttributeError, KeyError, TypeError):
        return []


def is_write_in_doubt(run: AgentRun) -> bool:
    """Whether ``run`` has a write in doubt (one query for its
    reconciliations, unless ``prefetch_related("reconciliations")`` fetched
    them)."""
    return (
        run.pending_effect == ToolEffect.NON_IDEMPOTENT_WRITE
        and run.status in RunStatus.terminal()
        and run.reconciliation is None
    )


class _JSONArrayHoldsText(Func):
    """SQLite (JSON1): whether the JSON document ``document`` holds at ``path``
    an array with the string ``text`` among its elements — what jsonb
    containment of ``[text]`` asks on PostgreSQL, where Django's ``contains``
    serves it (Django has no lookup for it on SQLite)."""

    arity = 3
    output_field = BooleanField()

    def as_sql(self, compiler, connection, **extra_context):
        raise NotSupportedError(f"{type(self).__name__} is for SQLite only")

    def as_sqlite(self, compiler, connection, **extra_context):
        (document, document_params), (path, path_params), (text, text_params) = (
            compiler.compile(expression) for expression in self.get_source_expressions()
        )
        at_path = (*document_params, *path_params)
        sql = (
            f"(json_type({document}, {path}) = 'array' AND EXISTS (SELECT 1 FROM"
            f" json_each({document}, {path}) AS element"
            f" WHERE element.type = 'text' AND element.value = {text}))"
        )
        return sql, (*at_path, *at_path, *text_params)


def offering_tool(queryset, name: str):
    """The runs of ``queryset`` whose request offers the tool ``name``: an
    element of its ``tools`` list, never a name mentioned elsewhere in it
    (a scripted turn's call, the prompt)."""
    if connection.vendor == "postgresql":
        # jsonb containment, served by the GIN index on request->'tools'.
        return queryset.filter(request__tools__contains=[name])
    return queryset.filter(_JSONArrayHoldsText(F("request"), Value("$.tools"), Value(name)))


def write_audit_runs(limit: int = 200):
    """Runs whose write audit failed, runs dead-lettered ``write_interrupted``,
    runs with a non-idempotent fence standing, and runs that executed a write
    but whose journal could not be replayed, newest first."""
    executed_a_write = Exists(RunStep.objects.filter(EXECUTED_WRITE, run=OuterRef("pk")))
    return (
        AgentRun.objects.filter(
            Q(error_type="AuditPersistenceFailed")
            | Q(termination_reason=TerminationReason.WRITE_INTERRUPTED)
            | Q(pending_effect=ToolEffect.NON_IDEMPOTENT_WRITE)
            | (
                Q(termination_reason=TerminationReason.JOURNAL_UNREPLAYABLE)
                & (executed_a_write | ~Q(pending_effect=""))
            )
        )
        .prefetch_related("reconciliations__operator")
        .order_by("-created_at")[:limit]
    )
