"""Server time of the operator and API pages, the reaper and the claim on a
large database, generated with SQL (not the ORM), and the indexes behind them."""

import statistics
import time
from datetime import date, timedelta

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client
from knox.models import AuthToken

#: The teams the runs are spread over (G22), ids from FIRST_TEAM on.
TEAMS = 50
FIRST_TEAM = 1001
GENERATE_TEAMS = """
INSERT INTO teams_team (id, name, slug, require_approval, webhook_secret, created_at)
SELECT t, 'Team ' || t, 'team-' || t, '[]'::jsonb, '', now()
FROM generate_series(%(first)s, %(first)s + %(teams)s - 1) AS t
"""
GENERATE_RUNS = """
INSERT INTO runs_agentrun (id, request, prompt, status, termination_reason, failure_class,
  error_type, error_message, output, mode, lease_owner, lease_token, pending_effect,
  requeue_count, step_count, prompt_tokens, completion_tokens, llm_latency_ms,
  journal_begins_after, tokens_saved_by_replay, dispatch_count, created_at, finished_at,
  team_id)
SELECT md5('run' || i)::uuid,
  jsonb_build_object('prompt', 'p' || i, 'tools',
    CASE WHEN i %% 3 = 0 THEN '["send_notification"]'::jsonb ELSE '["read_note"]'::jsonb END,
    'provider', '{"kind": "scripted", "turns": [{"content": "ok"}]}'::jsonb,
    'max_iterations', 20),
  'prompt ' || i,
  (ARRAY['completed','completed','completed','failed','cancelled'])[1 + i %% 5],
  (ARRAY['completed','completed','completed','not_retryable','cancelled'])[1 + i %% 5],
  CASE WHEN i %% 5 = 3 THEN 'auth' ELSE '' END, '', '', '',
  CASE WHEN i %% 2 = 0 THEN 'queued' ELSE 'interactive' END, '', 1,
  CASE WHEN i %% 1000 = 0 THEN 'non_idempotent_write' ELSE '' END, i %% 4, %(steps)s, 0, 0, 0,
  0, 0, i %% 4, now() - (i || ' seconds')::interval, now() - (i || ' seconds')::interval,
  %(first_team)s + i %% %(teams)s
FROM generate_series(1, %(runs)s) AS i
"""
GENERATE_STEPS = """
INSERT INTO runs_runstep (run_id, sequence, kind, tool_name, effect, error,
  idempotency_key, lease_token, created_at)
SELECT md5('run' || i)::uuid, s, CASE WHEN s %% 2 = 0 THEN 'tool' ELSE 'llm' END,
  CASE WHEN s %% 2 = 0 THEN 'read_note' ELSE '' END,
  CASE WHEN s %% 2 = 0 THEN 'read_only' ELSE '' END, '', '', 1, now()
FROM generate_series(1, %(runs)s) AS i, generate_series(1, %(steps)s) AS s
ORDER BY 1, 2
"""

# A year of spend: a row per day, submitter and model (G17), as the records
# of 1M runs' turns leave it for a hundred submitters and five models.
GENERATE_SPEND = """
INSERT INTO spend_dailyspend (day, submitter, provider, model, shard, turns, input_tokens,
  cached_input_tokens, output_tokens, cost, unpriced_turns)
SELECT current_date - d, u, 'openai', 'model-' || m, 0, 30, 30000, 5000, 3000, 0.12, 0
FROM generate_series(0, 364) AS d, generate_series(1, %(submitters)s) AS u,
  generate_series(1, 5) AS m
"""


def _timed(call, repeat=3) -> float:
    response = call()  # warm caches
    status = getattr(response, "status_code", 200)
    assert status == 200, f"{status}: {getattr(response, 'content', b'')[:200]!r}"
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def _plan(sql: str, params=()) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def _reaper_with_backlog() -> float:
    """One reaper pass over a backlog: every queued run due long ago (workers
    were down), each with its job waiting in Redis in the order it was
    dispatched. The pass must find the oldest jobs and dispatch nothing."""
    from runs.queue.dispatch import dispatch_many, run_queue
    from runs.reaper import reap_stale_runs

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_agentrun SET available_at = created_at WHERE status = 'queued' "
            "RETURNING id, requeue_count, available_at, team_id"
        )
        waiting = sorted(cursor.fetchall(), key=lambda row: row[2])
    # Each job on its team's queue, as dispatch puts it (G22).
    queues = [run_queue(team) for team in {team for *_, team in waiting}]
    for queue in queues:
        queue.empty()
    for start in range(0, len(waiting), 5000):
        dispatch_many(
            [(run_id, count, team) for run_id, count, _, team in waiting[start : start + 5000]]
        )
    report = reap_stale_runs()
    assert report.decisions == {}, f"a waiting job was taken for lost: {report.summary()}"
    elapsed = _timed(reap_stale_runs)
    for queue in queues:
        queue.empty()
    return elapsed


def _pruned_oldest_tenth(runs: int) -> dict:
    """Retention over the oldest tenth of the runs, at the shipped batch
    size: the dry run's count, the whole pass, and its longest batch (how
    long a batch holds its locks)."""
    from django.conf import settings
    from django.utils import timezone

    from runs.reaper.retention import prune_runs

    batch = settings.NRLLM_RETENTION_BATCH_SIZE
    # Retention never takes a run that ended less than an hour ago: the
    # oldest tenth is moved two days back (untimed), the rest stays.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_agentrun SET created_at = created_at - interval '2 days', "
            "finished_at = finished_at - interval '2 days' WHERE created_at < %s",
            [timezone.now() - timedelta(seconds=runs * 9 // 10)],
        )
    cutoff = timezone.now() - timedelta(days=1)
    started = time.perf_counter()
    would = prune_runs(cutoff, batch_size=batch, dry_run=True)
    dry_run_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    report = prune_runs(cutoff, batch_size=batch)
    pass_ms = (time.perf_counter() - started) * 1000
    assert report.runs == would.runs, (report.summary(), would.summary())
    size = f"{report.runs:,} runs, {report.steps:,} steps"
    return {
        f"prune, dry run ({size})": dry_run_ms,
        f"prune, the whole pass ({size}, batches of {batch})": pass_ms,
        f"prune, longest of its {report.batches} batches": report.longest_batch_ms,
    }


def _team_member(team_id: int):
    """A staff user holding every role in the team ``team_id`` and no
    global permission."""
    from teams.models import Membership
    from teams.roles import Role

    member = get_user_model().objects.create_user("member", "m@example.org", "m", is_staff=True)
    Membership.objects.bulk_create(
        Membership(user=member, team_id=team_id, role=role) for role in Role.values
    )
    return member


def at_scale(runs: int, steps_per_run: int) -> dict:
    from runs import transitions
    from runs.reaper import reap_stale_runs

    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        # A bulk load: the steps' foreign key checks (deferred triggers, one
        # per row, held until commit) are skipped for data generated
        # consistent, and steps go in index order.
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(GENERATE_TEAMS, {"first": FIRST_TEAM, "teams": TEAMS})
        cursor.execute(
            GENERATE_RUNS,
            {"runs": runs, "steps": steps_per_run, "first_team": FIRST_TEAM, "teams": TEAMS},
        )
        cursor.execute(GENERATE_STEPS, {"runs": runs, "steps": steps_per_run})
        cursor.execute(GENERATE_SPEND, {"submitters": 100 if runs >= 100_000 else 5})
    with connection.cursor() as cursor:
        # As autovacuum leaves a table that grew over days (it vacuums after
        # inserts too): the visibility map set, so a query answered from an
        # index alone (the overview's charts) reads no run rows.
        cursor.execute("VACUUM (ANALYZE) runs_agentrun")
        cursor.execute("ANALYZE runs_runstep")
        cursor.execute("ANALYZE spend_dailyspend")
    generated = time.perf_counter() - started

    admin = get_user_model().objects.create_superuser("bench", "b@example.org", "bench")
    client = Client()
    client.force_login(admin)
    api = Client(HTTP_AUTHORIZATION=f"Token {AuthToken.objects.create(user=admin)[1]}")
    pages = {}
    for name, query in [
        ("default", ""),
        ("status", "status__exact=failed"),
        ("termination_reason", "termination_reason__exact=not_retryable"),
        ("failure_class", "failure_class__exact=auth"),
        ("mode", "mode__exact=queued"),
        ("pending_effect", "pending_effect__exact=non_idempotent_write"),
        ("write_in_doubt", "write_in_doubt=yes"),
        ("tool", "tool=send_notification"),
        ("requeues", "requeues=3%2B"),
    ]:
        pages[f"admin runs list ({name})"] = _timed(
            lambda query=query: client.get(f"/admin/runs/agentrun/?{query}")
        )
    some_run = "c4ca4238-a0b9-3382-0dcc-509a6f75849b"
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM runs_agentrun ORDER BY created_at DESC LIMIT 1 OFFSET 100")
        some_run = str(cursor.fetchone()[0])
    pages["admin runs search (prompt)"] = _timed(
        lambda: client.get("/admin/runs/agentrun/?q=prompt+123456")
    )
    pages["api runs list"] = _timed(lambda: api.get("/api/runs/"))
    # A member of one team of the fifty, holding every role in it (G22).
    member = _team_member(FIRST_TEAM)
    member_client = Client()
    member_client.force_login(member)
    member_api = Client(HTTP_AUTHORIZATION=f"Token {AuthToken.objects.create(user=member)[1]}")
    pages[f"admin runs list (a member of one team of {TEAMS})"] = _timed(
        lambda: member_client.get("/admin/runs/agentrun/")
    )
    pages[f"api runs list (a member of one team of {TEAMS})"] = _timed(
        lambda: member_api.get("/api/runs/")
    )
    pages["api runs list (status)"] = _timed(lambda: api.get("/api/runs/?status=failed"))
    pages["api steps page"] = _timed(lambda: api.get(f"/api/runs/{some_run}/steps/?after=3"))
    pages["api usage by day (30 days)"] = _timed(lambda: api.get("/api/usage/?group_by=day"))
    a_year_ago = (date.today() - timedelta(days=365)).isoformat()
    for group in ("model", "user"):
        pages[f"api usage by {group} (a year)"] = _timed(
            lambda group=group: api.get(f"/api/usage/?group_by={group}&since={a_year_ago}")
        )
    # The admin index: the overview, its charts over 24 hours, or 7 days.
    pages["admin overview"] = _timed(lambda: client.get("/admin/"))
    pages["admin overview (7 days)"] = _timed(lambda: client.get("/admin/?window=7d"))
    pages["reaper pass, nothing stale"] = _timed(reap_stale_runs)

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_agentrun SET status = 'running', lease_expires_at = now() - "
            "interval '1 hour', lease_owner = 'dead' WHERE id IN (SELECT id FROM runs_agentrun "
            "WHERE status = 'completed' ORDER BY created_at LIMIT 1000)"
        )
    started = time.perf_counter()
    report = reap_stale_runs()
    pages["reaper pass, 1000 stale"] = (time.perf_counter() - started) * 1000
    queued = min(100_000, runs // 2)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_agentrun SET status = 'queued' WHERE id IN (SELECT id FROM "
            "runs_agentrun WHERE status IN ('completed', 'failed') ORDER BY created_at DESC "
            "LIMIT %s)",
            [queued],
        )
        cursor.execute("ANALYZE runs_agentrun")
        cursor.execute("SELECT id FROM runs_agentrun WHERE status = 'queued' LIMIT 6")
        targets = [row[0] for row in cursor.fetchall()]
    # Timed as a worker makes it: the first claim of a process prepares the
    # statement (one cold call measured 10.7 ms where warm ones take 3), so
    # it is left out; the median of five after it.
    assert transitions.claim(targets[0], "bench-worker", 60) is not None
    claimed = []
    for target in targets[1:]:
        started = time.perf_counter()
        lease = transitions.claim(target, "bench-worker", 60)
        claimed.append((time.perf_counter() - started) * 1000)
        assert lease is not None
    target = targets[-1]
    pages[f"claim with {queued} queued"] = statistics.median(claimed)
    backlog = f"reaper pass, {queued - len(targets)} queued long due, jobs in Redis"
    pages[backlog] = _reaper_with_backlog()

    pages.update(_pruned_oldest_tenth(runs))

    plans = {
        "admin list default": _plan(
            "SELECT * FROM runs_agentrun ORDER BY created_at DESC LIMIT 51"
        ),
        "a team member's list": _plan(
            "SELECT * FROM runs_agentrun WHERE team_id IN (%s) ORDER BY created_at DESC LIMIT 51",
            [FIRST_TEAM],
        ),
        "admin list by status": _plan(
            "SELECT * FROM runs_agentrun WHERE status = 'failed' ORDER BY created_at DESC LIMIT 51"
        ),
        # As console/search.py asks it, for the two words searched above.
        "admin prompt search": _plan(
            "SELECT id FROM runs_agentrun WHERE (UPPER(prompt) LIKE %s AND UPPER(prompt) LIKE %s "
            "AND status IN ('cancelled', 'completed', 'failed')) "
            "OR (UPPER(prompt) LIKE %s AND UPPER(prompt) LIKE %s "
            "AND status IN ('queued', 'running')) OR UPPER(lease_owner) = %s "
            "ORDER BY created_at + interval '0 seconds' DESC, id DESC LIMIT 51",
            ["%PROMPT%", "%123456%", "%PROMPT%", "%123456%", "PROMPT 123456"],
        ),
        "reaper selection": _plan(
            "SELECT id FROM runs_agentrun WHERE status = 'running' AND lease_expires_at < now() "
            "ORDER BY lease_expires_at LIMIT 1000"
        ),
        "claim": _plan(
            "UPDATE runs_agentrun SET status = 'running' WHERE id = %s AND status = 'queued'",
            [target],
        ),
        "steps page": _plan(
            "SELECT * FROM runs_runstep WHERE run_id = %s AND sequence > 3 ORDER BY sequence "
            "LIMIT 100",
            [some_run],
        ),
    }
    return {
        "runs": runs,
        "steps": runs * steps_per_run,
        "generate_seconds": generated,
        "milliseconds": pages,
        "reaped": len(report.decisions),
        "index_used": {
            # The search must reach ended runs through the trigram index, not
            # through the status index past every ended run.
            name: ("ended_prompt_trgm" in plan if "search" in name else "Index" in plan)
            for name, plan in plans.items()
        },
        "plans": plans,
    }
