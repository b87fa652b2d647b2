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
from runs.models.vocabulary import RunStatus, StepKind, TerminationReason
from tools.contract import idempotency_key_for
from tools.effects import ToolEffect

# A *write in doubt* (G10; G3, G7, G12, G13 say what leaves one): the one
# definition, for a queryset (the console's count and filter, the API's
# filter, the metric, retention) and for one run (the API's field, the runs
# list's "write in doubt", the requeue and restart verdicts); a test pins
# that they all agree. A run has a write in doubt when
#
# - it has ended (a running run's fence is a write under way; a queued one's
#   an idempotent write the runtime is retrying with its key);
# - its fence still stands on a write that only an operator can settle
#   (``needs_reconciling``): a ``non_idempotent_write``, whatever left it
#   there (interrupted, outcome unknown, its audit failed, its record lost
#   in a failover, a journal that cannot be replayed); or an
#   ``idempotent_write`` that a resumed attempt would not run again with its
#   key (``calls_going_live``: the turn that asked for it is gone, or its
#   outcome is recorded). An idempotent write whose call would run again
#   with its key (its audit failed, its outcome unknown) is settled by
#   running it again: no question for an operator;
# - and no reconciliation of that very write (the attempt's lease token and
#   the call's idempotency key) settles it. A result the write returned
#   after its time limit (a ``late_result`` step, G15) settles nothing by
#   itself: it is what the operator reads before reconciling.


#: A tool step whose write tool's code ran (its idempotency key is set).
EXECUTED_WRITE = Q(
    kind=StepKind.TOOL,
    effect__in=[ToolEffect.IDEMPOTENT_WRITE, ToolEffect.NON_IDEMPOTENT_WRITE],
) & ~Q(idempotency_key="")


def fenced_key():
    """The idempotency key of the call a run's fence stands on, as text;
    "" for a fence stamped before calls were stamped with it."""
    return Coalesce(KT("pending_call__idempotency_key"), Value(""), output_field=CharField())


def _reconciliations_of_the_fenced_write():
    """A run's reconciliations of the write its fence stands on, on a
    queryset annotated with ``fenced_key``."""
    return WriteReconciliation.objects.filter(
        run=OuterRef("pk"),
        lease_token=OuterRef("lease_token"),
        idempotency_key=OuterRef("fenced_key"),
    )


def _in_doubt(queryset) -> Q:
    """The condition, on ``queryset`` annotated with ``fenced_key``. Which
    idempotent writes a resumed attempt would not run again is a list of
    ids, found as the condition is built (one query over the fenced runs:
    the keys are computed in Python, as the resumed attempt computes them);
    the rest is on the row. Each arm names the effect, so the condition
    stays on the fenced runs' partial index."""
    ended = Q(status__in=RunStatus.terminal())
    unsettled = ~Exists(_reconciliations_of_the_fenced_write())
    not_run_again = _idempotent_writes_not_run_again(queryset.filter(ended & unsettled))
    return (
        ended
        & (
            Q(pending_effect=ToolEffect.NON_IDEMPOTENT_WRITE)
            | Q(pending_effect=ToolEffect.IDEMPOTENT_WRITE, pk__in=not_run_again)
        )
        & unsettled
    )


def writes_in_doubt(queryset):
    """The runs of ``queryset`` with a write in doubt."""
    annotated = queryset.annotate(fenced_key=fenced_key())
    return annotated.filter(_in_doubt(annotated))


def without_writes_in_doubt(queryset):
    """The runs of ``queryset`` that ``writes_in_doubt`` leaves out."""
    annotated = queryset.annotate(fenced_key=fenced_key())
    return annotated.exclude(_in_doubt(annotated))


def is_write_in_doubt(run: AgentRun) -> bool:
    """Whether ``run`` has a write in doubt. Asks the database only about
    an ended run fenced on an idempotent write (its journal's last turn,
    unless ``note_writes_in_doubt`` did for a page of runs) and for the
    run's reconciliations (unless ``prefetch_related("reconciliations")``
    fetched them)."""
    return needs_reconciling(run) and run.reconciliation is None


def needs_reconciling(run: AgentRun) -> bool:
    """Whether the write ``run``'s fence stands on, the run ended, is one
    only an operator can settle (reconciled or not: see the definition
    above). The requeue and restart verdicts refuse such a run until it is
    reconciled ``not_applied``."""
    if run.status not in RunStatus.terminal():
        return False
    if run.pending_effect == ToolEffect.NON_IDEMPOTENT_WRITE:
        return True
    if run.pending_effect != ToolEffect.IDEMPOTENT_WRITE or not _key_on_fence(run):
        return False
    noted = getattr(run, _NOT_RUN_AGAIN, None)
    if noted is None or noted[0] != _fence_as_it_stands(run):
        note_writes_in_doubt([run])
        noted = getattr(run, _NOT_RUN_AGAIN)
    return noted[1]


#: Where ``note_writes_in_doubt`` keeps, on a run, whether its idempotent
#: write would not run again, with the fence and journal it was found for.
_NOT_RUN_AGAIN = "_idempotent_write_not_run_again"


def note_writes_in_doubt(runs) -> None:
    """Find out, in one query for them all (none when none is an ended run
    fenced on an idempotent write), what ``is_write_in_doubt`` asks the
    database about each of ``runs``: a page of a list calls it once, so
    its rows ask nothing more. A run may be on a page more than once, as
    objects of its own (the dead letters: one row a letter): each is noted."""
    fenced: dict = {}
    for run in runs:
        if (
            run.status in RunStatus.terminal()
            and run.pending_effect == ToolEffect.IDEMPOTENT_WRITE
            and _key_on_fence(run)
        ):
            fenced.setdefault(run.pk, []).append(run)
    if not fenced:
        return
    candidates = AgentRun.objects.filter(pk__in=fenced).annotate(fenced_key=fenced_key())
    not_run_again = set(_idempotent_writes_not_run_again(candidates))
    for run_id, copies in fenced.items():
        for run in copies:
            setattr(run, _NOT_RUN_AGAIN, (_fence_as_it_stands(run), run_id in not_run_again))


def _key_on_fence(run: AgentRun) -> str:
    return (run.pending_call or {}).get("idempotency_key", "")


def _fence_as_it_stands(run: AgentRun) -> tuple:
    """What a noted answer was found for: a run changed since is asked again."""
    return (run.status, run.lease_token, run.step_count, _key_on_fence(run))


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


def _idempotent_writes_not_run_again(fenced) -> list:
    """The ids of the runs of ``fenced`` (annotated with ``fenced_key``)
    fenced on an ``idempotent_write`` whose call a resumed attempt would not
    run again with its key (``calls_going_live``). One query over the
    fenced runs alone (the ``run_fenced_idx`` index): each one's journal's
    last turn and the outcomes recorded after it."""
    journal_turns = RunStep.objects.filter(
        run=OuterRef("pk"), kind=StepKind.LLM, sequence__gt=OuterRef("journal_begins_after")
    )
    last_turn = journal_turns.order_by("-sequence")
    outcomes = RunStep.objects.filter(
        run=OuterRef("pk"), kind=StepKind.TOOL, sequence__gt=OuterRef("last_turn_sequence")
    )
    rows = (
        fenced.filter(pending_effect=ToolEffect.IDEMPOTENT_WRITE)
        .exclude(fenced_key="")
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
    runs with a non-idempotent fence standing, runs with a write in doubt,
    and runs that executed a write but whose journal could not be replayed,
    newest first."""
    executed_a_write = Exists(RunStep.objects.filter(EXECUTED_WRITE, run=OuterRef("pk")))
    return (
        AgentRun.objects.filter(
            Q(error_type="AuditPersistenceFailed")
            | Q(termination_reason=TerminationReason.WRITE_INTERRUPTED)
            | Q(pending_effect=ToolEffect.NON_IDEMPOTENT_WRITE)
            | Q(pk__in=writes_in_doubt(AgentRun.objects.all()).values("pk"))
            | (
                Q(termination_reason=TerminationReason.JOURNAL_UNREPLAYABLE)
                & (executed_a_write | ~Q(pending_effect=""))
            )
        )
        .prefetch_related("reconciliations__operator")
        .order_by("-created_at")[:limit]
    )
