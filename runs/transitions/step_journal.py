"""The PostgreSQL statements that change a run and append its steps at once,
each a single data-modifying CTE.

One round trip instead of five (BEGIN, UPDATE, SELECT, INSERT, COMMIT), and
a single statement is atomic on its own: a refused INSERT rolls back the
run's change with it (G2, G6). Three run changes ride with steps:

- recording steps under the lease (renewal, fence clearing or the next
  call's fence, totals, next sequence): usually one step, and more when
  earlier steps could not be recorded and are written now, in order, ahead
  of it (G12: the journal never has a gap). The caller says whether its
  commit waits for the WAL flush (``transitions.steps`` decides: model
  turns, reads and resume steps that stamp no write's fence do not);
- the claim, with the attempt's request step (its commit does not wait for
  the WAL flush: see ``claim_in_one_statement``);
- the final answer, with the settle (``completed``, or ``cancelled`` when a
  cancel was requested: a cancel wins over a final answer, G9).

The transitions package calls these on PostgreSQL and does the same with
the ORM elsewhere; only it decides when.
"""

import functools
import json
from collections.abc import Sequence

from django.db import connection, transaction

from runs.models import AgentRun, RunStep
from spend.recording import SPEND_CTE, USER_SPENT_COLUMN, spend_params, turns_spend
from spend.reservations import SETTLE_CTES
from spend.starting import CLAIM_COLUMNS, starting_spend_from_claim
from teams.models import Team
from tools.models import ToolSetting

_STEP_COLUMNS = (
    "kind",
    "tool_name",
    "effect",
    "arguments",
    "result",
    "error",
    "idempotency_key",
)
# One SELECT per step, numbered back from the step_count the UPDATE left:
# the last step takes step_count, the one before it step_count - 1, ...
_SELECT_STEP = """
    SELECT id, step_count{back}, lease_token, statement_timestamp(),
        %(kind{n})s, %(tool_name{n})s, %(effect{n})s, {arguments}, %(result{n})s::jsonb,
        %(error{n})s, %(idempotency_key{n})s
    FROM run
"""
_INSERT_STEPS = f"""
    INSERT INTO {RunStep._meta.db_table}
        (run_id, sequence, lease_token, created_at, {", ".join(_STEP_COLUMNS)})
"""
_OWNED = """
    WHERE id = %(run_id)s AND status = 'running'
      AND lease_owner = %(owner)s AND lease_token = %(token)s
      AND (%(recorded)s::integer IS NULL OR attempt_steps = %(recorded)s::integer)
"""
_RENEWED = "lease_expires_at = statement_timestamp() + make_interval(secs => %(lease_seconds)s)"
_USAGE = [
    "prompt_tokens = prompt_tokens + %(prompt_tokens)s",
    "cached_prompt_tokens = cached_prompt_tokens + %(cached_tokens)s",
    "completion_tokens = completion_tokens + %(completion_tokens)s",
    "cost = cost + %(cost)s",
    "unpriced_turns = unpriced_turns + %(unpriced_turns)s",
    "llm_latency_ms = llm_latency_ms + %(latency_ms)s",
]
#: What a record returns of the run: its guard's answer, and its totals
#: after the record (an attempt's budget checks read them, G17).
_RETURNING = (
    " RETURNING id, step_count, lease_token, cancel_requested_at,"
    " prompt_tokens, completion_tokens, cost, unpriced_turns"
)
#: With model turns, also what the spend CTE keys the submitter's day on.
_RETURNING_SPEND_KEY = (
    ", COALESCE(submitted_by_id, 0) AS spend_submitter,"
    " request #>> '{provider,kind}' AS spend_provider,"
    " COALESCE(request #>> '{provider,model}', request #>> '{provider,kind}') AS spend_model,"
    " team_id AS spend_team"
)
_SAVED = ["tokens_saved_by_replay = tokens_saved_by_replay + %(tokens_saved)s"]


def record_steps_in_one_statement(
    lease,
    lease_seconds: float,
    steps: Sequence[dict],
    *,
    clear_fence: bool,
    next_call,
    usage: dict,
    wait_for_flush: bool = True,
    recorded: int | None = None,
    tally=None,
) -> tuple[bool, object, int | None]:
    """Returns (matched, cancel_requested_at, the last step's sequence).
    Raises DatabaseError as the ORM would. ``steps`` may be empty: then it
    only renews (and stamps ``next_call``'s fence). Without
    ``wait_for_flush`` the statement's commit does not wait for its WAL to
    reach disk (as the claim's, ``claim_in_one_statement``). With
    ``recorded`` it matches only while the run holds that many of the
    attempt's steps (``AgentRun.attempt_steps``).

    ``next_call`` (a ``transitions.NextCall``) stamps the next call's fence in
    the same UPDATE; a cancel already requested stamps nothing (the old row's
    ``cancel_requested_at`` is what SET sees), and the caller stops.

    Model turns among ``steps`` add their spend to the submitter's day in
    the same statement; ``tally`` (a ``spend.recording.Tally``), when given,
    learns the run's totals (and the submitter's spend) as they stand after it.
    """
    sets = [*_counted(len(steps)), _RENEWED] if steps else [_RENEWED]
    fence = {}
    if next_call is not None and next_call.fence:
        sets += [
            "pending_effect = CASE WHEN cancel_requested_at IS NULL"
            " THEN %(next_fence)s ELSE '' END",
            "pending_call = CASE WHEN cancel_requested_at IS NULL THEN %(next_call)s::jsonb END",
        ]
        fence = {"next_fence": next_call.fence, "next_call": json.dumps(next_call.call)}
    elif next_call is not None or clear_fence:
        sets += ["pending_effect = ''", "pending_call = NULL"]
    row = _owned_run_then_steps(
        sets,
        steps,
        usage,
        {**_lease_params(lease, recorded), "lease_seconds": lease_seconds, **fence},
        wait_for_flush=wait_for_flush,
        tally=tally,
    )
    if row is None:
        return False, None, None
    return True, row[3], row[1]


def finish_in_one_statement(
    lease,
    steps: Sequence[dict],
    *,
    output: str,
    usage: dict,
    recorded: int | None = None,
    settle_reservations: bool = False,
):
    """Record the final answer's step (after any earlier ones still
    unwritten) and settle the run. Returns None if the lease is lost (or,
    with ``recorded``, the run does not hold that many of the attempt's
    steps), else (the run's ``cancel_requested_at`` — None: ``completed`` —,
    the final step's sequence). ``settle_reservations``: the attempt reserved before its
    calls, and this settles them (G21)."""
    completed = "cancel_requested_at IS NULL"
    sets = [
        *_counted(len(steps)),
        f"status = CASE WHEN {completed} THEN 'completed' ELSE 'cancelled' END",
        f"termination_reason = CASE WHEN {completed} THEN 'completed' ELSE 'cancelled' END",
        f"output = CASE WHEN {completed} THEN %(output)s ELSE '' END",
        # As every settle does: an earlier attempt's failure no longer describes the run.
        "failure_class = ''",
        "error_type = ''",
        "error_message = ''",
        "finished_at = statement_timestamp()",
        "lease_owner = ''",
        "lease_expires_at = NULL",
    ]
    params = {**_lease_params(lease, recorded), "output": output}
    row = _owned_run_then_steps(sets, steps, usage, params, settle_reservations=settle_reservations)
    return None if row is None else (row[3], row[1])


def claim_in_one_statement(run_id, owner: str, lease_seconds: float):
    """The claim with its request step. Returns (token, request, requeue_count,
    step_count, the requested tools an operator has disabled, their approval
    settings other than ``default`` by name, the attempt's
    ``spend.starting.StartingSpend``, whether its team has a cap on runs in
    flight) or None when the run was not ``queued`` or its team's cap held it
    back (G22). Its budget checks need no statement of their own (G17).

    The claim commits without waiting for its WAL to reach disk
    (``synchronous_commit = off`` for this transaction only): one flush less
    per run. Only a server crash before the WAL writer flushes it (a
    fraction of a second, ``wal_writer_delay``) can lose it, and losing it
    is safe:

    - The crash breaks the worker's connection. The run is ``queued`` again
      with its old token and its job spent, and the reaper dispatches it
      again (G4). The next claim may hand out the lost token again, but
      under another owner (``runs.runtime.attempt.worker_identity`` is unique per
      execution), so the stale worker's guarded writes match nothing (G5).
    - Nothing outside the database depends on the claim before a commit that
      waits for the flush: a write tool runs only after its fence's commit
      (G6), and PostgreSQL flushes the WAL in order, so that flush carries
      the claim with it. The settle and every step record still wait.

    ``tests/test_commit_durability.py`` crashes a server at both moments.
    """
    sql = f"""
        UPDATE {AgentRun._meta.db_table} SET status = 'running', lease_owner = %(owner)s,
            lease_token = lease_token + 1, {_RENEWED}, pending_effect = '',
            pending_call = NULL, started_at = statement_timestamp(),
            step_count = step_count + 1, attempt_steps = 1
        WHERE id = %(run_id)s AND status = 'queued'
            AND (available_at IS NULL OR available_at <= statement_timestamp())
        RETURNING id, step_count, lease_token, request, requeue_count, submitted_by_id,
            prompt_tokens, completion_tokens, cost, unpriced_turns, team_id
    """
    row = _run_then_steps(
        sql,
        [{"kind": "request"}],
        {"run_id": run_id, "owner": owner, "lease_seconds": lease_seconds},
        arguments_from_request=True,
        also_select=(
            f"{_DISABLED_REQUESTED_TOOLS}, {_APPROVAL_OVERRIDES}, {CLAIM_COLUMNS}, {_TEAM_CAPPED}"
        ),
        wait_for_flush=False,
    )
    if row is None:
        return None
    _, step_count, token, request, requeue_count, submitted_by = row[:6]
    totals, team = row[6:10], row[10]
    disabled, overrides, price, budget, spent, today, team_budget, capped = row[11:]
    if isinstance(request, str):  # Django loads jsonb as text; the model decodes it
        request = json.loads(request)
    overrides = dict(entry.rsplit(" ", 1) for entry in overrides)
    spend = starting_spend_from_claim(
        request, submitted_by, totals, price, budget, spent, today, team, team_budget
    )
    claimed = (token, request, requeue_count, step_count, frozenset(disabled), overrides, spend)
    return *claimed, bool(capped)


#: A FROM item that makes the statement's own transaction commit without
#: waiting for the WAL flush (the claim's, and the record of model turns,
#: reads and resume steps; the bench's floor job copies it).
COMMIT_WITHOUT_FLUSH = "(SELECT set_config('synchronous_commit', 'off', true)) AS no_flush"
#: Its opposite: the statement's transaction commits once its WAL is on
#: disk, whatever the session's, role's or database's default — a
#: ``synchronous_commit = off`` there must not make a fence, a write's record
#: or a settle one a server crash may lose (G6, G12).
COMMIT_WITH_FLUSH = "(SELECT set_config('synchronous_commit', 'on', true)) AS flush"

# The tools the run asks for that an operator has switched off since it was
# enqueued: the worker does not offer them. Read by the claim itself rather
# than by a query of its own.
_DISABLED_REQUESTED_TOOLS = f"""
    ARRAY(SELECT name FROM {ToolSetting._meta.db_table} WHERE NOT enabled
          AND name IN (SELECT jsonb_array_elements_text(run.request -> 'tools')))
"""

# Whether the run's team has a cap on runs in flight: then the attempt's end
# wakes a run the cap held back (``runs.transitions.team_caps``).
_TEAM_CAPPED = f"""
    (SELECT max_running IS NOT NULL FROM {Team._meta.db_table} WHERE id = run.team_id)
"""

# Their approval settings where an operator changed the default (G14), as
# "name setting" (split at the last space: a setting has none).
_APPROVAL_OVERRIDES = f"""
    ARRAY(SELECT name || ' ' || approval FROM {ToolSetting._meta.db_table}
          WHERE approval <> 'default'
          AND name IN (SELECT jsonb_array_elements_text(run.request -> 'tools')))
"""


def _owned_run_then_steps(
    sets: list[str],
    steps: Sequence[dict],
    usage: dict,
    params: dict,
    *,
    wait_for_flush=True,
    tally=None,
    settle_reservations=False,
):
    """The lease-guarded UPDATE of ``sets`` (plus llm steps' usage totals and
    a resume step's saved tokens) with ``steps``, and the model turns' spend
    added to the submitter's day; the row (id, step_count, lease_token,
    cancel_requested_at, the run's totals) or None when the lease no longer
    matches. ``tally``: as ``record_steps_in_one_statement``'s; its
    ``reserving`` (or ``settle_reservations``) settles the attempt's reservations (G21)."""
    returning = _RETURNING
    spend = turns_spend(steps)
    extra_ctes, also_select, spend_values = [], "", {}
    if "prompt_tokens" in usage:
        sets = [*sets, *_USAGE]
    if "tokens_saved" in usage:
        sets = [*sets, *_SAVED]
    if spend:
        returning += _RETURNING_SPEND_KEY
        extra_ctes.append(SPEND_CTE)
        spend_values = spend_params(spend, params["run_id"])
        if settle_reservations or (tally is not None and tally.reserving):
            extra_ctes.append(SETTLE_CTES)
    if tally is not None and tally.budget_since is not None:
        also_select = USER_SPENT_COLUMN
        spend_values = {**spend_values, **tally.user_params()}
    row = _run_then_steps(
        f"UPDATE {AgentRun._meta.db_table} SET {', '.join(sets)} {_OWNED}{returning}",
        steps,
        {**params, **usage, **spend_values},
        wait_for_flush=wait_for_flush,
        extra_ctes=extra_ctes,
        also_select=also_select,
    )
    if row is not None and tally is not None:
        tally.saw_run(*row[4:8])
        if also_select:
            tally.saw_user(*row[-1], spend)
    return row


def _lease_params(lease, recorded: int | None) -> dict:
    return {
        "run_id": lease.run_id,
        "owner": lease.owner,
        "token": lease.token,
        "recorded": recorded,
    }


def _counted(count: int) -> list[str]:
    """The run's step numbering and the attempt's own count grow by ``count``."""
    return [
        f"step_count = step_count + {count}",
        f"attempt_steps = attempt_steps + {count}",
    ]


def _run_then_steps(
    update_sql: str,
    steps: Sequence[dict],
    params: dict,
    *,
    arguments_from_request=False,
    also_select="",
    wait_for_flush=True,
    extra_ctes: Sequence[str] = (),
):
    values = {}
    for index, step in enumerate(steps):
        # The usual single step keeps unsuffixed names: one statement text.
        _add_step_values(values, step, "" if len(steps) == 1 else f"_{index}")
    columns = f"run.*, {also_select}" if also_select else "run.*"
    sql = f"WITH run AS ({update_sql})"
    if steps:
        sql += f", step AS ({_insert_steps(len(steps), arguments_from_request)} RETURNING 1)"
    for cte in extra_ctes:
        sql += f", {cte}"
    sql += f" SELECT {columns} FROM run"
    if wait_for_flush:
        # Alone or in a caller's transaction: waiting is never less safe.
        sql += f", {COMMIT_WITH_FLUSH}"
    elif not connection.in_atomic_block:
        # Alone, the statement is its transaction, and a setting local to it
        # decides how it commits. (In a caller's transaction it would decide
        # how the caller's work commits: not this statement's choice.)
        sql += f", {COMMIT_WITHOUT_FLUSH}"
    # Inside a caller's transaction the statement needs a savepoint of its
    # own, so a refused INSERT does not abort the caller; in autocommit it
    # is atomic alone.
    if connection.in_atomic_block:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, {**params, **values})
            return cursor.fetchone()
    with connection.cursor() as cursor:
        cursor.execute(sql, {**params, **values})
        return cursor.fetchone()


@functools.cache
def _insert_steps(count: int, arguments_from_request: bool) -> str:
    """The INSERT of ``count`` steps (built once per shape: a step is recorded
    on the hot path)."""
    selects = []
    for index in range(count):
        suffix = "" if count == 1 else f"_{index}"
        back = count - 1 - index
        # The request step's arguments are the stored request the UPDATE returned.
        arguments = "request" if arguments_from_request else f"%(arguments{suffix})s::jsonb"
        selects.append(
            _SELECT_STEP.format(back=f" - {back}" if back else "", n=suffix, arguments=arguments)
        )
    return f"{_INSERT_STEPS} {' UNION ALL '.join(selects)}"


def _add_step_values(values: dict, step: dict, suffix: str) -> None:
    for column in ("arguments", "result"):
        value = step.get(column)
        values[column + suffix] = None if value is None else json.dumps(value)
    values["kind" + suffix] = step.get("kind")
    for column in ("tool_name", "effect", "error", "idempotency_key"):
        values[column + suffix] = step.get(column) or ""
