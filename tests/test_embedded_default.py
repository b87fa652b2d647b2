"""`make run`'s embedded default: SQLite and in-process execution, no Redis,
no PostgreSQL. The set-up commands run as `make run` runs them."""

import os

from tests.helpers import manage


def test_make_runs_setup_works_on_sqlite_without_redis(tmp_path):
    env = {
        "PATH": os.environ["PATH"],
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "SECRET_KEY": "embedded-test",
        "NRLLM_ADMIN_PASSWORD": "pw",
    }
    for command in (["migrate", "--noinput"], ["ensure_admin"], ["seed_demo"], ["check"]):
        result = manage(*command, env=env)
        assert result.returncode == 0, (command, result.stderr[-2000:])
    seeded = manage("seed_demo", env=env)
    assert "not seeded again" in seeded.stdout
    listing = manage(
        "shell",
        "-c",
        "from runs.models import AgentRun; "
        "print(sorted((r.status, r.termination_reason) for r in AgentRun.objects.all()))",
        env=env,
    )
    assert listing.stdout.strip().splitlines()[-1] == (
        "[('cancelled', 'cancelled'), ('completed', 'completed'), "
        "('failed', 'not_retryable'), ('failed', 'not_retryable')]"
    )


def test_steps_stay_append_only_on_sqlite_through_every_migration(tmp_path):
    # SQLite rebuilds a table to change it, which drops its triggers: the
    # append-only guard (G11) must survive those rebuilds, both ways. On a
    # fresh database the runs app alone can be migrated, tools after it.
    env = {
        "PATH": os.environ["PATH"],
        "DATABASE_URL": f"sqlite:///{tmp_path / 'migrated.sqlite3'}",
        "SECRET_KEY": "embedded-test",
    }
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
        "print(sorted(agent_run.steps.values_list('error', flat=True)))",
        env=env,
    )
    assert attempt.returncode == 0, attempt.stderr[-2000:]
    assert attempt.stdout.splitlines()[-2:] == [
        "refused: run steps are append-only; UPDATE refused",
        "['', '']",
    ]
