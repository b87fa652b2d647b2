"""`make run`'s embedded default: SQLite and in-process execution, no Redis,
no PostgreSQL. The set-up commands run as `make run` runs them."""

import json
import os
import uuid
from datetime import datetime, timedelta

from django.contrib.auth.hashers import PBKDF2PasswordHasher

from agents.management.commands import seed_demo
from tests.drifting_model import openai_request
from tests.embedded_processes import (
    STOPPED_SECONDS,
    embedded_worker,
    make_run_setup,
    progress,
    sqlite_rows,
    sqlite_write,
    start_embedded_worker,
)
from tests.fake_openai import error
from tests.helpers import manage, sqlite_env, wait_until

#: A wait fails after this long with nothing moving (``progress``), not
#: after this long in all: a loaded host is slow, a stuck one still.
STALLED = 60.0


def test_make_runs_setup_works_on_sqlite_without_redis_and_ends_with_how_to_log_in(tmp_path):
    """`make run`'s set-up commands, read from the Makefile, on a fresh
    SQLite file with the shipped approval policy (non_idempotent_write):
    a line per demo run, then a block with the address, the user and the
    password (or where it is) — never the ~130 lines it printed, the demo's
    injected fault as an ERROR among them (issue #47). Run again, as a
    second `make run`: nothing seeded twice, the block says where the
    password is. Then the embedded worker takes the demo's runs on."""
    kept = tmp_path / "admin-password"
    steps = make_run_setup(RUN_ADDRESS="127.0.0.1:8077", ADMIN_PASSWORD_FILE=str(kept))
    assert [step[0] for step in steps] == ["migrate", "seed_demo", "ensure_admin"]
    env = sqlite_env(tmp_path / "demo.sqlite3")

    def set_up() -> list[str]:
        printed = []
        for step in steps:
            done = manage(*step, env=env)
            assert done.returncode == 0, (step, done.stderr[-2000:])
            printed += done.stdout.splitlines() + done.stderr.splitlines()
        assert not [line for line in printed if "ERROR" in line or "Traceback" in line], printed
        # The last lines printed, the block: what an operator needs to log in.
        block = [line for line in printed if line.strip()][-6:]
        assert block[0] == block[-1] and set(block[0]) == {"-"}, printed
        assert block[1:3] == ["The admin:  http://127.0.0.1:8077/admin/", "user:       admin"]
        return printed

    first = set_up()
    assert len(first) < 25, first  # a line per demo run above it, nothing of the runtime's log
    password = kept.read_text().strip()
    assert first[-3] == f"password:   {password}  (generated now; kept in {kept})"
    # The demo's team members (G22) log in with the same password.
    assert first[-2] == "teams:      olga, sam, pat (same password)"
    for username in ("admin", "olga", "pat"):
        ((encoded,),) = sqlite_rows(
            env, f"SELECT password FROM auth_user WHERE username = '{username}'"
        )
        # Hashed as the app's settings hash (the tests' own hasher is a faster one).
        assert PBKDF2PasswordHasher().verify(password, encoded), username
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    again = set_up()
    assert "runs exist; demo data not seeded again" in again
    assert again[-3] == f"password:   in {kept} (generated when the account was made)"
    assert manage("check", env=env).returncode == 0

    def outcomes():
        return sorted(sqlite_rows(env, "SELECT status, termination_reason FROM runs_agentrun"))

    def decisions():
        return dict(
            sqlite_rows(
                env,
                "SELECT run.prompt, approval.status || ' by ' || coalesce(user.username, '-') "
                "FROM runs_approvalrequest approval JOIN runs_agentrun run ON run.id = "
                "approval.run_id LEFT JOIN auth_user user ON user.id = approval.decided_by_id "
                # An edited call's request comes after the one it replaced.
                "ORDER BY approval.id",
            )
        )

    def sent(scenario) -> int:
        return sqlite_rows(
            env,
            "SELECT count(*) FROM tools_outboxnotification WHERE run_id = "
            "(SELECT id FROM runs_agentrun WHERE prompt = ?)",
            scenario["prompt"],
        )[0][0]

    # Each demo notification waited for approval; the demo's approver
    # decided all but one, which waits for the operator.
    assert decisions() == {
        seed_demo.COMPLETED["prompt"]: "approved by demo-approver",
        seed_demo.AUDIT_FAILED["prompt"]: "approved by demo-approver",
        seed_demo.RESUMED["prompt"]: "approved by demo-approver",
        seed_demo.APPROVED["prompt"]: "approved by demo-approver",
        seed_demo.DENIED["prompt"]: "denied by demo-approver",
        seed_demo.WAITING["prompt"]: "pending by -",
        # People in the loop (G24): a question, and an edit waiting for approval.
        seed_demo.ASKING["prompt"]: "pending by -",
        seed_demo.EDITED["prompt"]: "pending by -",
    }
    assert [sent(seed_demo.APPROVED), sent(seed_demo.DENIED), sent(seed_demo.WAITING)] == [1, 0, 0]
    # The demo run that failed once waits its backoff; the embedded worker,
    # which `make run` starts next, runs its retry when due.
    assert ("queued", "") in outcomes()
    expected = [
        ("cancelled", "cancelled"),
        ("completed", "completed"),
        ("completed", "completed"),
        ("completed", "completed"),
        ("completed", "completed"),
        ("completed", "completed"),  # Support's own (G22)
        # Support's schedule, backfilled twice, and its trigger's one run (G23).
        ("completed", "completed"),
        ("completed", "completed"),
        ("completed", "completed"),
        ("failed", "budget_exhausted"),
        ("failed", "not_retryable"),
        ("failed", "not_retryable"),
        ("waiting_for_approval", ""),
        ("waiting_for_approval", ""),
        ("waiting_for_input", ""),
    ]
    with embedded_worker(env) as worker:
        wait_until(
            lambda: outcomes() == expected,
            timeout=STALLED,
            progress=progress(env, worker),
            what="the demo run's retry",
        )
        # The worker's passes leave the waiting run alone; the operator
        # approves it (as the admin does, from another process) and it runs
        # to its end, its notification sent once.
        approved = manage(
            "shell",
            "-c",
            "from django.contrib.auth import get_user_model\n"
            "from runs.approvals.actions import approve\n"
            "from runs.models import ApprovalRequest\n"
            "approval = ApprovalRequest.objects.get(status='pending', "
            f"run__prompt={seed_demo.WAITING['prompt']!r})\n"
            "admin = get_user_model().objects.get(username='admin')\n"
            "print(approve(approval, admin, digest=approval.digest).code)",
            env=env,
        )
        assert approved.returncode == 0, approved.stderr[-2000:]
        assert approved.stdout.splitlines()[-1] == "approved"
        # Approved, it is queued, then run by the embedded worker: waited for to its end.
        wait_until(
            lambda: outcomes().count(("completed", "completed")) == 9,
            timeout=STALLED,
            progress=progress(env, worker),
            what="the approved run",
        )
    assert outcomes().count(("completed", "completed")) == 9
    assert decisions()[seed_demo.WAITING["prompt"]] == "approved by admin"
    assert sent(seed_demo.WAITING) == 1


def test_steps_stay_append_only_on_sqlite_through_every_migration(tmp_path):
    # SQLite rebuilds a table to change it, which drops its triggers: the
    # append-only guard (G11) must survive those rebuilds, both ways. On a
    # fresh database the runs app alone can be migrated, tools after it.
    env = sqlite_env(tmp_path / "migrated.sqlite3")
    for command in (["migrate", "runs"], ["migrate"], ["migrate", "runs", "0009"], ["migrate"]):
        result = manage(*command, "--noinput", env=env)
        assert result.returncode == 0, (command, result.stderr[-2000:])
    attempt = manage(
        "shell",
        "-c",
        "from django.db import DatabaseError\n"
        "from runs.runtime import run\n"
        "agent_run = run({'prompt': 'p', 'provider': {'kind': 'scripted', 'turns': "
        "[{'content': 'done'}]}})\n"
        "try:\n"
        "    agent_run.steps.update(error='rewritten')\n"
        "except DatabaseError as error:\n"
        "    print('refused:', error)\n"
        "print(sorted(agent_run.steps.values_list('error', flat=True)))\n"
        "from runs.reaper.retention import delete_whole_runs\n"
        "print(delete_whole_runs([agent_run.pk]), agent_run.steps.count())\n"
        # Retention, on SQLite: its batch's lock is the database's.
        "from datetime import timedelta\n"
        "from django.core.management import call_command\n"
        "from runs.models import AgentRun, RunStep\n"
        "old = run({'prompt': 'p', 'provider': {'kind': 'scripted', 'turns': "
        "[{'content': 'done'}]}})\n"
        "AgentRun.objects.filter(pk=old.pk).update(created_at=old.created_at - "
        "timedelta(days=2), finished_at=old.finished_at - timedelta(days=2))\n"
        "call_command('prune_runs', '--older-than', '1d')\n"
        "print(AgentRun.objects.count(), RunStep.objects.count())\n"
        # What an operator found about a deleted run's write stays.
        "import uuid\n"
        "from django.contrib.auth.models import User\n"
        "from runs.models import WriteReconciliation\n"
        "WriteReconciliation.objects.create(run_id=uuid.uuid4(), lease_token=1, "
        "outcome='applied', note='n', operator=User.objects.create(username='o'))",
        env=env,
    )
    assert attempt.returncode == 0, attempt.stderr[-2000:]
    assert attempt.stdout.splitlines()[-5:-2] == [
        "refused: run steps are append-only; UPDATE refused",
        "['', '']",
        "1 0",
    ]
    assert attempt.stdout.splitlines()[-2].startswith("deleted 1 run (2 steps) that ended before ")
    assert attempt.stdout.splitlines()[-1] == "0 0"
    # Its constraint cannot come back over it: the reverse refuses, naming why.
    back = manage("migrate", "runs", "0021", "--noinput", env=env)
    assert back.returncode != 0
    assert "1 write reconciliation(s) belong to runs that retention deleted" in back.stderr


def test_unwritten_steps_are_written_in_order_with_the_next_one_on_sqlite(tmp_path, migrated):
    """The ORM's version of the multi-step record (G12), on SQLite: steps the
    database refused go in, in order, ahead of the step recorded next."""
    migrated(tmp_path / "steps.sqlite3")
    env = sqlite_env(tmp_path / "steps.sqlite3")
    script = (
        "from runs import transitions\n"
        "run = transitions.create_queued_run({'prompt': 'p'}, 'p')\n"
        "lease = transitions.claim(run.pk, 'w', 60).lease\n"
        "usage = {'prompt_tokens': 3, 'completion_tokens': 0}\n"
        "steps = [{'kind': 'llm', 'result': {'usage': usage}},"
        " {'kind': 'tool', 'tool_name': 'read_note'}, {'kind': 'llm', 'result': {}}]\n"
        "print(transitions.record_steps(lease, 60, steps, clear_fence=False).name)\n"
        "final = {'kind': 'llm', 'result': {'content': 'ok', 'tool_calls': []}}\n"
        "resume = {'kind': 'resume', 'result': {'tokens_saved': 5}}\n"
        "print(transitions.finish(lease, [resume, final], output='ok').name)\n"
        "run.refresh_from_db()\n"
        "print(list(run.steps.values_list('sequence', 'kind')), run.step_count,"
        " run.prompt_tokens, run.tokens_saved_by_replay, run.status)\n"
    )
    result = manage("shell", "-c", script, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[-3:] == [
        "PERSISTED",
        "COMPLETED",
        "[(1, 'request'), (2, 'llm'), (3, 'tool'), (4, 'llm'), (5, 'resume'), (6, 'llm')] "
        "6 3 5 completed",
    ]


# The embedded worker (`manage.py embedded_worker`, which `make run` starts
# beside the web server): it executes the runs, a thread each (delayed retries
# when due), and the reaper runs.


def _embedded_env(tmp_path, fake_openai, **extra) -> dict:
    return {
        "PATH": os.environ["PATH"],
        "DATABASE_URL": f"sqlite:///{tmp_path / 'embedded.sqlite3'}",
        "SECRET_KEY": "embedded-test",
        "NRLLM_OPENAI_BASE_URL": fake_openai.base_url,
        "NRLLM_OPENAI_API_KEY": "sk-test-not-a-real-key",
        **{name: str(value) for name, value in extra.items()},
    }


def _run(env, run_id) -> dict:
    columns = ("status", "termination_reason", "requeue_count", "available_at", "started_at")
    row = sqlite_rows(env, f"SELECT {', '.join(columns)} FROM runs_agentrun WHERE id = ?", run_id)
    return dict(zip(columns, row[0], strict=True))


def _steps(env, run_id) -> list[tuple]:
    return sqlite_rows(
        env,
        "SELECT sequence, kind, tool_name, result FROM runs_runstep WHERE run_id = ? "
        "ORDER BY sequence",
        run_id,
    )


def _moment(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_a_retry_waits_for_its_backoff_and_the_embedded_worker_runs_it_when_due(
    tmp_path, fake_openai, drifting_model, migrated
):
    env = _embedded_env(tmp_path, fake_openai, NRLLM_RETRY_BACKOFF_SECONDS=2)
    migrated(tmp_path / "embedded.sqlite3")
    drifting_model.fail_turn(0, error(429, "slow down"))
    request = openai_request("answer", [{"answer": "done (take {take})"}], tools=[])
    with embedded_worker(env) as worker:
        # No Redis: the new run waits for the embedded worker, which executes
        # it; its model call is refused with a 429, and the retry is left to
        # wait its backoff.
        enqueued = manage("enqueue_run", "-", env=env, stdin=json.dumps(request))
        assert enqueued.returncode == 0, enqueued.stderr[-2000:]
        run_id = uuid.UUID(enqueued.stdout.strip().splitlines()[-1]).hex
        wait_until(
            lambda: _run(env, run_id)["requeue_count"] == 1,
            timeout=STALLED,
            progress=progress(env, worker, model=drifting_model),
            what="the first attempt",
        )
        waiting = _run(env, run_id)
        # Not run nested in the failed attempt: queued, due its backoff after
        # that attempt's claim (both times the database's clock).
        assert waiting["status"] == "queued"
        due_after = _moment(waiting["available_at"]) - _moment(waiting["started_at"])
        assert due_after >= timedelta(seconds=2)
        assert drifting_model.requests_by_turn[0] == 1
        wait_until(
            lambda: _run(env, run_id)["status"] == "completed",
            timeout=STALLED,
            progress=progress(env, worker, model=drifting_model),
            what="the retry",
        )
    done = _run(env, run_id)
    assert (done["termination_reason"], done["requeue_count"]) == ("completed", 1)
    # Its second claim (started_at, the database's clock) came when it was due.
    assert _moment(done["started_at"]) >= _moment(waiting["available_at"])
    assert drifting_model.requests_by_turn[0] == 2
    assert [kind for _, kind, _, _ in _steps(env, run_id)].count("request") == 2


def test_the_embedded_worker_reaps_a_run_whose_process_was_killed_and_it_resumes(
    tmp_path, fake_openai, drifting_model, migrated
):
    """The embedded worker executing a run (in a thread of its own) is
    SIGKILLed mid-call; the next embedded worker reaps the run and resumes
    it, its recorded write not executed again."""
    env = _embedded_env(tmp_path, fake_openai)
    migrated(tmp_path / "embedded.sqlite3")
    plan = [
        {"calls": [{"name": "upsert_note", "arguments": {"slug": "s", "body": "v{take}"}}]},
        {"answer": "noted (take {take})"},
    ]
    drifting_model.hold_turn(1)  # the model call after the write: killed in it
    enqueued = manage(
        "enqueue_run",
        "-",
        env=env,
        stdin=json.dumps(openai_request("note it", plan, ["upsert_note"])),
    )
    assert enqueued.returncode == 0, enqueued.stderr[-2000:]
    first = start_embedded_worker(env)
    try:
        wait_until(
            drifting_model.held.is_set,
            timeout=STALLED,
            progress=progress(env, first, model=drifting_model),
            what="the run's second turn",
        )
    finally:
        first.kill()  # SIGKILL: the run is left running, its lease unrenewed
        first.communicate(timeout=STOPPED_SECONDS)
    ((run_id, status),) = sqlite_rows(env, "SELECT id, status FROM runs_agentrun")
    assert status == "running"
    # Its lease lapses: moved back, not waited for. (A lease short enough
    # to wait for would lapse under the next worker too, on a loaded host,
    # and the run be reaped again.)
    sqlite_write(env, "UPDATE runs_agentrun SET lease_expires_at = started_at WHERE id = ?", run_id)

    with embedded_worker(env) as worker:
        wait_until(
            lambda: _run(env, run_id)["status"] == "completed",
            timeout=STALLED,
            progress=progress(env, worker, model=drifting_model),
            what="reap and resume",
        )
    done = _run(env, run_id)
    assert (done["termination_reason"], done["requeue_count"]) == ("completed", 1)
    steps = _steps(env, run_id)
    reaper_steps = [json.loads(result) for _, kind, _, result in steps if kind == "reaper"]
    assert [step["decision"] for step in reaper_steps] == ["requeued"]
    # Resumed from the journal: the recorded write was not executed again.
    assert [tool for _, kind, tool, _ in steps if kind == "tool"] == ["upsert_note"]
    assert [kind for _, kind, _, _ in steps].count("resume") == 1
    assert sqlite_rows(env, "SELECT body FROM tools_note") == [("v1",)]


def test_the_embedded_worker_refuses_to_start_with_redis_configured(tmp_path):
    env = {
        "PATH": os.environ["PATH"],
        "DATABASE_URL": f"sqlite:///{tmp_path / 'refused.sqlite3'}",
        "SECRET_KEY": "embedded-test",
        "REDIS_URL": "redis://127.0.0.1:1/0",
    }
    refused = manage("embedded_worker", env=env)
    assert refused.returncode != 0
    assert "REDIS_URL is set" in refused.stderr and "rqworker --with-scheduler" in refused.stderr


def test_a_capped_teams_runs_all_run_on_the_embedded_worker(tmp_path, migrated):
    """G22 on SQLite: Alpha may have one run in flight. The embedded worker
    (4 slots) takes Alpha's 4 runs one at a time, as a trigger that notes
    every run becoming ``running`` sees, while Bravo's 2 run beside them;
    every run completes (the ones the cap held are woken)."""
    env = sqlite_env(tmp_path / "embedded.sqlite3", NRLLM_WORKER_CONCURRENCY="4")
    migrated(tmp_path / "embedded.sqlite3")
    sqlite_write(env, "CREATE TABLE seen_running (team_id integer, running integer)")
    sqlite_write(
        env,
        "CREATE TRIGGER note_running AFTER UPDATE OF status ON runs_agentrun "
        "WHEN NEW.status = 'running' AND OLD.status <> 'running' BEGIN "
        "INSERT INTO seen_running SELECT NEW.team_id, count(*) FROM runs_agentrun "
        "WHERE team_id = NEW.team_id AND status = 'running'; END",
    )
    enqueued = manage(
        "shell",
        "-c",
        "from runs.runtime import enqueue\n"
        "from teams.models import Team\n"
        "alpha = Team.objects.create(name='Alpha', slug='alpha', max_running=1)\n"
        "bravo = Team.objects.create(name='Bravo', slug='bravo')\n"
        "turn = {'content': 'done', 'delay_seconds': 0.5}\n"
        "request = {'prompt': 'p', 'provider': {'kind': 'scripted', 'turns': [turn]}}\n"
        "for team in [alpha] * 4 + [bravo] * 2: enqueue(request, team=team)\n",
        env=env,
    )
    assert enqueued.returncode == 0, enqueued.stderr[-2000:]
    with embedded_worker(env) as worker:
        wait_until(
            lambda: (
                sqlite_rows(env, "SELECT count(*) FROM runs_agentrun WHERE status = 'completed'")[
                    0
                ][0]
                == 6
            ),
            timeout=STALLED,
            progress=progress(env, worker),
            what="every run to complete",
        )
    most = dict(sqlite_rows(env, "SELECT team_id, max(running) FROM seen_running GROUP BY team_id"))
    alpha, bravo = (
        sqlite_rows(env, "SELECT id FROM teams_team WHERE slug = ?", slug)[0][0]
        for slug in ("alpha", "bravo")
    )
    assert most[alpha] == 1 and most[bravo] == 2, most
    assert sqlite_rows(env, "SELECT count(*) FROM runs_heldrun") == [(0,)]


def test_a_schedule_fires_each_slot_once_on_the_embedded_worker(tmp_path, migrated):
    """G23 under ``make run``: no rqcron, no Redis; the embedded worker's
    passes fire a schedule every second, each slot once (the unique row on
    SQLite), and run what they fired."""
    env = sqlite_env(tmp_path / "embedded.sqlite3")
    migrated(tmp_path / "embedded.sqlite3")
    created = manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User\n"
        "from agents.versions import save_agent\n"
        "from triggers.models import Schedule\n"
        "owner = User.objects.create_superuser('owner')\n"
        "turn = {'content': 'digest done'}\n"
        "agent, _, _ = save_agent('digest', {'provider': {'kind': 'scripted', 'turns': [turn]}},"
        " create=True)\n"
        "schedule = Schedule(agent=agent, name='every-second', interval_seconds=1,"
        " input_template='digest for ${scheduled_time}', overlap='allow', owner=owner)\n"
        "schedule.full_clean(); schedule.save()\n",
        env=env,
    )
    assert created.returncode == 0, created.stderr[-2000:]
    fired = "SELECT count(*) FROM triggers_firing WHERE outcome = 'fired'"
    with embedded_worker(env) as worker:
        wait_until(
            lambda: sqlite_rows(env, fired)[0][0] >= 3,
            timeout=STALLED,
            progress=progress(env, worker),
            what="three slots fired",
        )
    rows = sqlite_rows(
        env,
        "SELECT f.slot, f.outcome, r.status FROM triggers_firing f "
        "LEFT JOIN runs_agentrun r ON r.id = f.run_id ORDER BY f.slot",
    )
    slots = [datetime.fromisoformat(slot) for slot, _, _ in rows]
    assert slots == [slots[0] + timedelta(seconds=n) for n in range(len(slots))]
    assert {(outcome, status) for _, outcome, status in rows} <= {
        ("fired", "completed"),
        ("fired", "queued"),
        ("fired", "running"),
    }
    assert sqlite_rows(env, "SELECT count(*) FROM runs_agentrun") == [(len(rows),)]
