"""Recording a step on PostgreSQL in one statement.

The guarded UPDATE of the run (ownership, lease renewal, fence clearing or
the next call's fence, totals, next sequence) and the INSERT of the step are
folded into one
data-modifying CTE: one round trip instead of five (BEGIN, UPDATE, SELECT,
INSERT, COMMIT). A single statement is atomic on its own, so a refused
INSERT still rolls back the renewal and the fence clearing (G2, G6).
"""

import json

from django.db import connection, transaction

from runs.models import AgentRun, RunStep

_STEP_COLUMNS = (
    "kind",
    "tool_name",
    "effect",
    "arguments",
    "result",
    "error",
    "idempotency_key",
    "replay_of",
)


def record_step_in_one_statement(
    lease, lease_seconds: float, step: dict, *, clear_fence: bool, next_call, usage: dict
) -> tuple[bool, object]:
    """Returns (matched, cancel_requested_at). Raises DatabaseError as the ORM would.

    ``next_call`` (a ``transitions.NextCall``) stamps the next call's fence in
    the same UPDATE; a cancel already requested stamps nothing (the old row's
    ``cancel_requested_at`` is what SET sees), and the caller stops.
    """
    sets = [
        "step_count = step_count + 1",
        "lease_expires_at = statement_timestamp() + make_interval(secs => %(lease_seconds)s)",
    ]
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
    if usage:
        sets += [
            "prompt_tokens = prompt_tokens + %(prompt_tokens)s",
            "completion_tokens = completion_tokens + %(completion_tokens)s",
            "llm_latency_ms = llm_latency_ms + %(latency_ms)s",
        ]
    values = {column: step.get(column) for column in _STEP_COLUMNS}
    for column in ("tool_name", "effect", "error", "idempotency_key"):
        values[column] = values[column] or ""
    for column in ("arguments", "result"):
        values[column] = None if values[column] is None else json.dumps(values[column])
    sql = f"""
        WITH run AS (
            UPDATE {AgentRun._meta.db_table} SET {", ".join(sets)}
            WHERE id = %(run_id)s AND status = 'running'
              AND lease_owner = %(owner)s AND lease_token = %(token)s
            RETURNING step_count, cancel_requested_at
        ), step AS (
            INSERT INTO {RunStep._meta.db_table}
                (run_id, sequence, lease_token, created_at, {", ".join(_STEP_COLUMNS)})
            SELECT %(run_id)s, step_count, %(token)s, statement_timestamp(),
                %(kind)s, %(tool_name)s, %(effect)s, %(arguments)s::jsonb, %(result)s::jsonb,
                %(error)s, %(idempotency_key)s, %(replay_of)s
            FROM run
            RETURNING 1
        )
        SELECT step_count, cancel_requested_at FROM run
    """
    params = {
        "run_id": lease.run_id,
        "owner": lease.owner,
        "token": lease.token,
        "lease_seconds": lease_seconds,
        **fence,
        **usage,
        **values,
    }
    # Inside a caller's transaction the statement needs a savepoint of its
    # own, so a refused INSERT does not abort the caller; in autocommit it
    # is atomic alone.
    if connection.in_atomic_block:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
    else:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
    if row is None:
        return False, None
    return True, row[1]
