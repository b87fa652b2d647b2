"""`make run`'s embedded default: SQLite and in-process execution, no Redis,
no PostgreSQL. The set-up commands run as `make run` runs them."""

from tests.helpers import manage, sqlite_env


def test_make_runs_setup_works_on_sqlite_without_redis(tmp_path):
    env = sqlite_env(tmp_path / "demo.sqlite3", NRLLM_ADMIN_PASSWORD="pw")
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
        "[('cancelled', 'cancelled'), ('completed', 'completed'), ('completed', 'completed'), "
        "('failed', 'not_retryable'), ('failed', 'not_retryable')]"
    )


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
        "print(sorted(agent_run.steps.values_list('error', flat=True)))",
        env=env,
    )
    assert attempt.returncode == 0, attempt.stderr[-2000:]
    assert attempt.stdout.splitlines()[-2:] == [
        "refused: run steps are append-only; UPDATE refused",
        "['', '']",
    ]


def test_unwritten_steps_are_written_in_order_with_the_next_one_on_sqlite(tmp_path):
    """The ORM's version of the multi-step record (G12), on SQLite: steps the
    database refused go in, in order, ahead of the step recorded next."""
    env = sqlite_env(tmp_path / "steps.sqlite3")
    assert manage("migrate", "--noinput", env=env).returncode == 0
    script = (
        "from runs import transitions\n"
        "run = transitions.create_queued_run({'prompt': 'p'}, 'p')\n"
        "lease = transitions.claim(run.pk, 'w', 60).lease\n"
        "steps = [{'kind': 'llm', 'result': {'usage': {'prompt_tokens': 3}}},"
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
